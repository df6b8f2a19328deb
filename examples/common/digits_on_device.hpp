#pragma once
// The digits split into train and test sets, as flat tensors on one device ([n, 64] pixels in
// [0, 1], [n] labels): the examples that keep the whole (small) data set on the device and gather
// their batches there.
#include <cstdint>

#include <ember/ember.hpp>

#include "digits.hpp"

namespace examples {

struct DigitsOnDevice {
  ember::Tensor<float> x_train, x_test;
  ember::Tensor<int64_t> y_train, y_test;
};

inline DigitsOnDevice digits_on_device(double test_fraction, uint64_t seed, ember::Device dev) {
  Digits all = load_digits(), train, test;
  split_digits(all, test_fraction, seed, train, test);
  return {ember::Tensor<float>::from_vector(train.pixels, {train.n, 64}, dev),
          ember::Tensor<float>::from_vector(test.pixels, {test.n, 64}, dev),
          ember::Tensor<int64_t>::from_vector(train.labels, {train.n}, dev),
          ember::Tensor<int64_t>::from_vector(test.labels, {test.n}, dev)};
}

}  // namespace examples
