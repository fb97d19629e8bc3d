// A launch plan recorded on an H100 80GB HBM3 with these kernels (its
// benchmark run of 2026-12-05), for planning
// without a GPU: schedule_test checks the batch-invariance rule on it as on
// the H200's (kernels/h200_plan.h, the same kernels).
// Read it with LaunchPlan::Parse(kH100Plan + 1, &plan).
#ifndef SOFTMAX_KERNELS_H100_PLAN_H_
#define SOFTMAX_KERNELS_H100_PLAN_H_

namespace softmax {
namespace gpu {

inline constexpr char kH100Plan[] = R"(
softmax launch plan: device 0 (NVIDIA H100 80GB HBM3), 132 SMs, L2 50 MiB, clusters up to 8
  kernel                       paths                  threads  regs  local  static  blocks/SM  cluster  clusters   grid
  on_chip<float32>             warp,block                 256   128      0     256          2        1         0    264
  flat.t64<float32>            flat                        64    29      0     256         32        1         0   4224
  flat.t128<float32>           flat                       128    29      0     256         16        1         0   2112
  flat.t256<float32>           flat                       256    29      0     256          8        1         0   1056
  flat.t512<float32>           flat                       512    29      0     256          4        1         0    528
  flat_table<float32>          flat_table                 512    64      0     512          2        1         0    264
  row_staged<float32>          row_staged                 256    48      0     256          5        1         0    660
  row_staged.long<float32>     row_staged.long            256    48      0     256          5        1         0    660
  on_chip<float32>             warp,block,cluster         256   128      0     256          2        2       132    264
  on_chip<float32>             warp,block,cluster         256   128      0     256          2        4        62    248
  on_chip<float32>             warp,block,cluster         256   128      0     256          2        8        30    240
  on_chip<float32>             warp,block,cluster         256   128      0     256          2       16        14    224
  split_staged<float32>        split                      256    46      0     128          3        1         0    396
  staged<float32>              staged                     256    70      0     256          1        1       132    132
  staged<float32>              staged                     256    70      0     256          1        2        66    132
  staged<float32>              staged                     256    70      0     256          1        4        30    120
  staged<float32>              staged                     256    70      0     256          1        8        15    120
  staged<float32>              staged                     256    70      0     256          1       16         7    112
  strided_staged<float32>      strided                    256    69      0     384          1        1       132    132
  strided_staged<float32>      strided                    256    69      0     384          1        2        66    132
  strided_staged<float32>      strided                    256    69      0     384          1        4        30    120
  strided_staged<float32>      strided                    256    69      0     384          1        8        15    120
  strided_staged<float32>      strided                    256    69      0     384          1       16         7    112
  split_fused<float32>         split                      256   108      0     128          2        1         0    264
  split_stats<float32>         split                      256    57      0     128          4        1         0    528
  split_normalize<float32>     split                      256   127      0     128          2        1         0    264
  strided_stats<float32>       strided                    256   125      0    8320          2        1         0    264
  strided_normalize<float32>   strided                    256   121      0       0          2        1         0    264
  on_chip<float16>             warp,block                 256   128      0     256          2        1         0    264
  flat.t64<float16>            flat                        64    32      0     256         32        1         0   4224
  flat.t128<float16>           flat                       128    32      0     256         16        1         0   2112
  flat.t256<float16>           flat                       256    32      0     256          8        1         0   1056
  flat.t512<float16>           flat                       512    32      0     256          4        1         0    528
  flat_table<float16>          flat_table                 512    64      0     512          2        1         0    264
  row_staged<float16>          row_staged                 256    48      0     256          5        1         0    660
  row_staged.long<float16>     row_staged.long            256    48      0     256          5        1         0    660
  on_chip<float16>             warp,block,cluster         256   128      0     256          2        2       132    264
  on_chip<float16>             warp,block,cluster         256   128      0     256          2        4        62    248
  on_chip<float16>             warp,block,cluster         256   128      0     256          2        8        30    240
  on_chip<float16>             warp,block,cluster         256   128      0     256          2       16        14    224
  split_staged<float16>        split                      256    61      0     128          3        1         0    396
  staged<float16>              staged                     256    64      0     256          1        1       132    132
  staged<float16>              staged                     256    64      0     256          1        2        66    132
  staged<float16>              staged                     256    64      0     256          1        4        30    120
  staged<float16>              staged                     256    64      0     256          1        8        15    120
  staged<float16>              staged                     256    64      0     256          1       16         7    112
  strided_staged<float16>      strided                    256    80      0     640          1        1       132    132
  strided_staged<float16>      strided                    256    80      0     640          1        2        66    132
  strided_staged<float16>      strided                    256    80      0     640          1        4        30    120
  strided_staged<float16>      strided                    256    80      0     640          1        8        15    120
  strided_staged<float16>      strided                    256    80      0     640          1       16         7    112
  split_fused<float16>         split                      256   110      0     128          2        1         0    264
  split_stats<float16>         split                      256    63      0     128          4        1         0    528
  split_normalize<float16>     split                      256   124      0     128          2        1         0    264
  strided_stats<float16>       strided                    256   128      0   16512          2        1         0    264
  strided_normalize<float16>   strided                    256   128      0       0          2        1         0    264
  on_chip<bfloat16>            warp,block                 256   128      0     256          2        1         0    264
  flat.t64<bfloat16>           flat                        64    32      0     256         32        1         0   4224
  flat.t128<bfloat16>          flat                       128    32      0     256         16        1         0   2112
  flat.t256<bfloat16>          flat                       256    32      0     256          8        1         0   1056
  flat.t512<bfloat16>          flat                       512    32      0     256          4        1         0    528
  flat_table<bfloat16>         flat_table                 512    64      0     512          2        1         0    264
  row_staged<bfloat16>         row_staged                 256    48      0     256          5        1         0    660
  row_staged.long<bfloat16>    row_staged.long            256    48      0     256          5        1         0    660
  on_chip<bfloat16>            warp,block,cluster         256   128      0     256          2        2       132    264
  on_chip<bfloat16>            warp,block,cluster         256   128      0     256          2        4        62    248
  on_chip<bfloat16>            warp,block,cluster         256   128      0     256          2        8        30    240
  on_chip<bfloat16>            warp,block,cluster         256   128      0     256          2       16        14    224
  split_staged<bfloat16>       split                      256    61      0     128          3        1         0    396
  staged<bfloat16>             staged                     256    64      0     256          1        1       132    132
  staged<bfloat16>             staged                     256    64      0     256          1        2        66    132
  staged<bfloat16>             staged                     256    64      0     256          1        4        30    120
  staged<bfloat16>             staged                     256    64      0     256          1        8        15    120
  staged<bfloat16>             staged                     256    64      0     256          1       16         7    112
  strided_staged<bfloat16>     strided                    256    80      0     640          1        1       132    132
  strided_staged<bfloat16>     strided                    256    80      0     640          1        2        66    132
  strided_staged<bfloat16>     strided                    256    80      0     640          1        4        30    120
  strided_staged<bfloat16>     strided                    256    80      0     640          1        8        15    120
  strided_staged<bfloat16>     strided                    256    80      0     640          1       16         7    112
  split_fused<bfloat16>        split                      256   110      0     128          2        1         0    264
  split_stats<bfloat16>        split                      256    63      0     128          4        1         0    528
  split_normalize<bfloat16>    split                      256   124      0     128          2        1         0    264
  strided_stats<bfloat16>      strided                    256   128      0   16512          2        1         0    264
  strided_normalize<bfloat16>  strided                    256   128      0       0          2        1         0    264
)";

}  // namespace gpu
}  // namespace softmax

#endif  // SOFTMAX_KERNELS_H100_PLAN_H_
