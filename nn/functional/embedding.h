// Table lookup as a differentiable op: Embedding (torch.nn.functional.embedding).
//
//   namespace F = nn::functional;
//   // tok [B, T, C] = the rows of wte [V, C] that tokens [B, T] (int32) name:
//   absl::StatusOr<core::Tensor> tok = F::Embedding(tokens, wte);
//
// NOTE [Functional Embedding]: the op issues nn::Embedding's dispatch calls in their order
// (nn::EmbeddingForward, nn::EmbeddingBackward), so with the same table, ids and output
// gradient it gives the same bits. The ids are checked on the host and a private copy is
// kept on the table's device for the backward, so a caller reusing its id buffer cannot
// send the backward out of bounds. A table that is a parameter leaf gets its gradient added
// into Parameter::grad (made fp32 zeros first where undefined), as the layer does; any
// other table gets its gradient returned.
#ifndef NN_FUNCTIONAL_EMBEDDING_H_
#define NN_FUNCTIONAL_EMBEDDING_H_

#include "absl/status/statusor.h"
#include "core/autograd.h"
#include "core/tensor.h"

namespace nn {
namespace functional {

// y[i..., :] = table[ids[i...], :] (NOTE [Functional Embedding]): ids int32 [...] on the
// CPU or the table's device, each in [0, V); table [V, C] fp32 or bf16; y fp32 [..., C] on
// the table's device. The gradient is the table's (dL/dtable[v] = the sum of dL/dy over the
// positions holding v); ids have none. InvalidArgument "Embedding: ..." for a table that is
// not 2-D fp32 or bf16, ids that are not int32 or on another device, and an id outside
// [0, V) (naming the id, its flat position and the ids' shape).
absl::StatusOr<core::Tensor> Embedding(core::Arg ids, core::Arg table);

}  // namespace functional
}  // namespace nn

#endif  // NN_FUNCTIONAL_EMBEDDING_H_
