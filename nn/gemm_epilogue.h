// nn::GemmEpilogue, what a GEMM does to its product before it stores it (NOTE [GEMM
// epilogues] in nn/tensor_ops.h). Its own header so that both nn::MatMul (nn/tensor_ops.h)
// and the cuBLASLt GEMM under it (nn/cuda/gemm.h) name it.
//
//   nn::GemmArgs g;
//   g.epilogue = nn::GemmEpilogue::kBiasGelu;
#ifndef NN_GEMM_EPILOGUE_H_
#define NN_GEMM_EPILOGUE_H_

namespace nn {

// The numbers are kernels::GemmEpilogueKind's (kernels/elementwise.h), checked in
// nn/matmul.cc.
enum class GemmEpilogue : int {
  kNone = 0,
  kBias = 1,
  kBiasGelu = 2,
  kDGelu = 3,
  kBiasResidual = 4,
  kResidual = 5,
};

}  // namespace nn

#endif  // NN_GEMM_EPILOGUE_H_
