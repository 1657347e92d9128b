// FSDP_HD marks a function that runs on the host and on a CUDA device.
//
//   FSDP_HD inline float Square(float x) { return x * x; }
//
// Kernel bodies (elementwise and row-wise math) are written once as FSDP_HD inline
// functions: a CPU loop calls them in the CPU build and a CUDA kernel calls them on the
// device, so the CPU tests exercise the same math the GPU runs. Under nvcc the macro is
// `__host__ __device__`; for every other compiler it is empty.
#ifndef CORE_HD_H_
#define CORE_HD_H_

#if defined(__CUDACC__)
#define FSDP_HD __host__ __device__
#else
#define FSDP_HD
#endif

#endif  // CORE_HD_H_
