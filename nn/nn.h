// The whole nn/ package in one include: layers with hand-written backward and losses.
//
//   #include "nn/nn.h"
//   ASSIGN_OR_RETURN(std::shared_ptr<nn::Gpt> gpt, nn::Gpt::Create(nn::GptConfig{}));
//   auto mlp = nn::Sequential::Make({std::make_shared<nn::Linear>(8, 32),
//                                    std::make_shared<nn::GELU>(),
//                                    std::make_shared<nn::Linear>(32, 8)});
#ifndef NN_NN_H_
#define NN_NN_H_

#include "nn/activations.h"
#include "nn/attention.h"
#include "nn/embedding.h"
#include "nn/gpt.h"
#include "nn/grouped_query_attention.h"
#include "nn/layer_norm.h"
#include "nn/linear.h"
#include "nn/llama.h"
#include "nn/losses.h"
#include "nn/ops.h"
#include "nn/rms_norm.h"
#include "nn/rotary.h"
#include "nn/sequential.h"
#include "nn/swiglu.h"
#include "nn/tensor_ops.h"
#include "nn/to_device.h"
#include "nn/transformer.h"

#endif  // NN_NN_H_
