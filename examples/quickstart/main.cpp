// The README's 20-line example: fit y = 3x - 1 + noise with a linear model and SGD.
#include <ember/ember.hpp>
#include <cstdio>
using namespace ember;

int main() {
  Device dev = cuda::is_available() ? Device::cuda(0) : Device::cpu();
  manual_seed(0);
  auto x = Tensor<float>::randn({256, 1}, dev);
  auto y = x * 3.0 - 1.0 + Tensor<float>::randn({256, 1}, dev, 0.0, 0.1);
  auto w = Tensor<float>::zeros({1, 1}, dev).set_requires_grad();
  auto b = Tensor<float>::zeros({1}, dev).set_requires_grad();
  for (int step = 0; step < 200; ++step) {
    auto loss = mean(square(matmul(x, w) + b - y));
    w.zero_grad(), b.zero_grad();
    loss.backward();
    NoGradGuard no_grad;  // the update is not part of the graph
    w.copy_(w - w.grad() * 0.1);
    b.copy_(b - b.grad() * 0.1);
  }
  std::printf("w = %.3f, b = %.3f on %s\n", w.item(), b.item(), dev.str().c_str());
}
