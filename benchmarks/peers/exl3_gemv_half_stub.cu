// exllamav3's half-integer bitrate GEMV instances (1.5 / 2.5 / 3.5 bits a weight) are not benchmarked:
// this stands in for comp_units/exl3_gemv_half_inst.cu so the build compiles only the instances it times.
void* exl3_gemv_select_kernel_half(int, bool, int, int, bool) { return nullptr; }
