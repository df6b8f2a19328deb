// Bad input gets a clear exception naming the op, the shapes, dtypes and devices.
// One test per kind of bad input; each checks the message.
#include <catch2/catch.hpp>

#include <ember/ember.hpp>

#include "pretend_gpu.hpp"

using namespace ember;
using Catch::Contains;

using testing::PretendGpu;

TEST_CASE("errors: mismatched shapes name the op and both shapes", "[errors]") {
  auto a = Tensor<float>::ones({2, 3});
  auto b = Tensor<float>::ones({4, 5});
  CHECK_THROWS_AS(a + b, ShapeError);
  CHECK_THROWS_WITH(a + b, Contains("add") && Contains("[2, 3]") && Contains("[4, 5]"));
  CHECK_THROWS_WITH(matmul(a, b), Contains("matmul") && Contains("float32[2, 3]") && Contains("float32[4, 5]"));
  CHECK_THROWS_WITH(concat(std::vector<Tensor<float>>{a, b}, 0), Contains("concat") && Contains("[4, 5]"));
  CHECK_THROWS_WITH(split(a, {1, 1}, 1), Contains("split") && Contains("add up to 2"));
  CHECK_THROWS_WITH(a.reshape({4}), Contains("reshape") && Contains("[4]"));
  CHECK_THROWS_WITH(expand(a, Shape{3, 3}), Contains("expand"));
  CHECK_THROWS_WITH(permute(a, {0}), Contains("permute"));
  CHECK_THROWS_WITH(matmul(Tensor<float>::ones({2, 2, 3}), Tensor<float>::ones({4, 3, 2})),
                    Contains("matmul: batch dimensions differ") && Contains("[4, 3, 2]"));
}

TEST_CASE("errors: wrong dtypes name the op and both dtypes", "[errors]") {
  auto f = Tensor<float>::ones({2});
  auto d = Tensor<double>::ones({2});
  CHECK_THROWS_AS(op::add(f, d), DTypeError);
  CHECK_THROWS_WITH(op::add(f, d), Contains("add") && Contains("float32") && Contains("float64"));
  auto i = Tensor<int32_t>::ones({2, 2});
  CHECK_THROWS_WITH(exp(i), Contains("exp") && Contains("int32"));
  CHECK_THROWS_WITH(matmul(i, i), Contains("matmul") && Contains("int32"));
  CHECK_THROWS_WITH(softmax(i), Contains("softmax") && Contains("int32"));
  CHECK_THROWS_WITH(mean(i), Contains("mean") && Contains("int32"));
  CHECK_THROWS_WITH(index_select(f, 0, Tensor<float>::zeros({1})), Contains("index_select") && Contains("int64"));
  CHECK_THROWS_WITH(op::where(f, f, f), Contains("where") && Contains("uint8"));
  CHECK_THROWS_WITH(Tensor<half>(AnyTensor(f)), Contains("Tensor<float16>") && Contains("float32"));
}

TEST_CASE("errors: tensors on different devices name both devices", "[errors][device]") {
  PretendGpu pretend;
  auto a = Tensor<float>::ones({2});
  auto b = Tensor<float>::ones({2}, Device::cuda(0));
  CHECK(b.device() == Device::cuda(0));
  CHECK_THROWS_AS(a + b, DeviceError);
  CHECK_THROWS_WITH(a + b, Contains("add") && Contains("on cpu") && Contains("on cuda:0"));
  CHECK_THROWS_WITH(matmul(a.reshape({1, 2}), b.reshape({2, 1})), Contains("matmul") && Contains("cuda:0"));
  CHECK_THROWS_WITH(linear(a.reshape({1, 2}), b.reshape({1, 2})), Contains("linear") && Contains("cuda:0"));
  CHECK_THROWS_WITH(linear(a.reshape({1, 2}), a.reshape({1, 2}), Tensor<float>::ones({1}, Device::cuda(0))),
                    Contains("linear") && Contains("on cpu") && Contains("cuda:0"));
  CHECK_THROWS_WITH(index_select(a, 0, Tensor<int64_t>::zeros({1}, Device::cuda(0))),
                    Contains("index_select") && Contains("cuda:0"));
  CHECK_THROWS_WITH(b.data(), Contains("data()") && Contains("cuda:0"));
  // Moving one side fixes it.
  CHECK((a + b.to(Device::cpu())).to_vector() == std::vector<float>{2, 2});
}

TEST_CASE("errors: a device that does not exist", "[errors][device]") {
  const int n = cuda::device_count();
  CHECK_THROWS_AS(Tensor<float>::zeros({2}, Device::cuda(n + 3)), DeviceError);
  CHECK_THROWS_WITH(Tensor<float>::zeros({2}, Device::cuda(n + 3)),
                    Contains("cuda:" + std::to_string(n + 3)));
}

TEST_CASE("errors: empty tensors cannot be reduced to an extremum", "[errors]") {
  auto e = Tensor<float>::zeros({0, 3});
  CHECK_THROWS_AS(max(e), ShapeError);
  CHECK_THROWS_WITH(max(e), Contains("max") && Contains("float32[0, 3]"));
  CHECK_THROWS_WITH(argmax(e, {0}), Contains("argmax") && Contains("[0, 3]"));
  CHECK_THROWS_WITH(min(e, {0}), Contains("min") && Contains("empty"));
  // Sums of empty tensors are zero, as in PyTorch, and empty matmuls are fine.
  CHECK(sum(e).item() == 0.0f);
  CHECK(sum(e, {0}).to_vector() == std::vector<float>{0, 0, 0});
  CHECK(matmul(Tensor<float>::zeros({2, 0}), Tensor<float>::zeros({0, 3})).to_vector() == std::vector<float>(6, 0.0f));
  CHECK_THROWS_WITH(Tensor<float>().shape(), Contains("undefined tensor"));
}

TEST_CASE("errors: out-of-range indices and dimensions", "[errors]") {
  auto x = Tensor<float>::ones({4, 3});
  CHECK_THROWS_AS(index_select(x, 0, Tensor<int64_t>::from_vector({0, 4})), IndexError);
  CHECK_THROWS_WITH(index_select(x, 0, Tensor<int64_t>::from_vector({0, 4})),
                    Contains("index_select") && Contains("index 4") && Contains("size 4") && Contains("float32[4, 3]"));
  CHECK_THROWS_WITH(index_select(x, 1, Tensor<int64_t>::from_vector({-1})), Contains("index -1"));
  CHECK_THROWS_WITH(embedding(x, Tensor<int32_t>::from_vector({9})), Contains("embedding") && Contains("index 9"));
  CHECK_THROWS_WITH(gather(x, 1, Tensor<int64_t>::full({4, 1}, 3.0)), Contains("gather") && Contains("index 3"));
  CHECK_THROWS_WITH(sum(x, {2}), Contains("sum") && Contains("dimension 2 out of range"));
  CHECK_THROWS_WITH(softmax(x, -3), Contains("softmax") && Contains("dimension -3"));
  CHECK_THROWS_WITH(x.select(4), Contains("select") && Contains("index 4"));
  CHECK_THROWS_WITH(x.size(5), Contains("size"));
  CHECK_THROWS_WITH(transpose(x, 0, 2), Contains("transpose"));
}

TEST_CASE("errors: invalid values", "[errors]") {
  auto x = Tensor<float>::ones({2});
  CHECK_THROWS_AS(clamp(x, 1.0, 0.0), ValueError);
  CHECK_THROWS_WITH(clamp(x, 1.0, 0.0), Contains("clamp") && Contains("min 1"));
  CHECK_THROWS_AS(chunk(x, 0), ValueError);
}

TEST_CASE("errors: every error kind derives from ember::Error", "[errors]") {
  CHECK_THROWS_AS(Tensor<float>::ones({2}) + Tensor<float>::ones({3}), Error);
  CHECK_THROWS_AS(op::add(Tensor<float>::ones({2}), Tensor<double>::ones({2})), Error);
  CHECK_THROWS_AS(throw OutOfMemory("x", 1, 2, 3), Error);
  CHECK_THROWS_AS(throw CudaError("x"), Error);
  CHECK_THROWS_AS(throw CublasError("x"), Error);
  CHECK_THROWS_AS(throw CudnnError("x"), Error);
  CHECK_THROWS_AS(throw NcclError("x"), Error);
}
