// softmax.v1 requests with random float32 inputs, and the check of their
// responses against the float64 reference, shared by the tests that call
// the server over gRPC.
//
// Thread-safety: pure functions.
#ifndef SOFTMAX_SERVER_TESTING_V1_MESSAGES_H_
#define SOFTMAX_SERVER_TESTING_V1_MESSAGES_H_

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu_softmax.h"
#include "softmax/v1/softmax.pb.h"

namespace softmax::server::testing {

// A float32 request of `shape` along `axis`, its values N(0, 3) from `seed`.
inline v1::SoftmaxRequest RandomRequest(const std::string& id, const std::vector<int64_t>& shape,
                                        int axis, uint32_t seed) {
  v1::SoftmaxRequest request;
  request.set_request_id(id);
  request.set_axis(axis);
  v1::Tensor* input = request.mutable_input();
  input->set_dtype(v1::DTYPE_FLOAT32);
  int64_t count = 1;
  for (int64_t d : shape) {
    input->add_shape(d);
    count *= d;
  }
  std::vector<float> values(static_cast<size_t>(count));
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (float& v : values) v = normal(rng);
  input->set_data(values.data(), values.size() * sizeof(float));
  return request;
}

// Checks `response` against the float64 reference for `request` (float32,
// softmax, temperature 1).
inline void ExpectCorrect(const v1::SoftmaxRequest& request,
                          const v1::SoftmaxResponse& response) {
  ASSERT_EQ(response.request_id(), request.request_id());
  ASSERT_EQ(response.output().dtype(), request.input().dtype());
  ASSERT_EQ(response.output().shape_size(), request.input().shape_size());
  ASSERT_EQ(response.output().data().size(), request.input().data().size());
  const int rank = request.input().shape_size();
  const int axis = request.axis() < 0 ? request.axis() + rank : request.axis();
  SoftmaxShape shape{1, request.input().shape(axis), 1};
  for (int i = 0; i < axis; ++i) shape.outer *= request.input().shape(i);
  for (int i = axis + 1; i < rank; ++i) shape.inner *= request.input().shape(i);
  std::vector<double> expected(static_cast<size_t>(shape.elements()));
  ReferenceSoftmax(request.input().data().data(), DType::kFloat32, shape, SoftmaxOptions(),
                   expected.data());
  for (int64_t i = 0; i < shape.elements(); ++i) {
    const float got = LoadAsFloat(response.output().data().data(), DType::kFloat32, i);
    ASSERT_NEAR(got, expected[i], 1e-6 + 2e-6 * std::fabs(expected[i])) << "element " << i;
  }
}

}  // namespace softmax::server::testing

#endif  // SOFTMAX_SERVER_TESTING_V1_MESSAGES_H_
