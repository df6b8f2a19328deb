// The small gaps a new user hit (issue 14): std/var with a correction, named_modules(), printing
// a module, Shape from a std::vector<int64_t>, and mse_loss (l1, smooth_l1) broadcasting its
// target as PyTorch does, with PyTorch's warning once.
#include <catch2/catch.hpp>

#include <cmath>
#include <iostream>
#include <sstream>

#include <ember/ember.hpp>

#include "test_util.hpp"

using namespace ember;
using Catch::Contains;

TEST_CASE("gaps: var and std with a correction match torch.var/torch.std", "[gaps][reduce]") {
  // (std is ember::std: with `using namespace ember` an unqualified std(x) is ambiguous.)
  // torch.tensor([[1., 2., 4.], [3., 5., 9.]]).var() = 8.0; .var(dim=1) = [2.3333, 9.3333];
  // .var(dim=1, correction=0) = [1.5556, 6.2222]; .std(dim=0) = [1.4142, 2.1213, 3.5355].
  auto x = Tensor<double>::from_vector({1, 2, 4, 3, 5, 9}, Shape{2, 3});
  CHECK(var(x).item() == Approx(8.0));
  CHECK(ember::std(x).item() == Approx(std::sqrt(8.0)));
  testing::check_close(var(x, {1}).to_double_vector(), {7.0 / 3.0, 28.0 / 3.0}, 1e-12);
  testing::check_close(var(x, {1}, 0.0).to_double_vector(), {14.0 / 9.0, 56.0 / 9.0}, 1e-12);
  testing::check_close(ember::std(x, {0}).to_double_vector(), {std::sqrt(2.0), std::sqrt(4.5), std::sqrt(12.5)}, 1e-12);
  CHECK(var(x, {-1}, 1.0, true).shape() == Shape{2, 1});
  CHECK(var(x, {0, 1}).item() == Approx(8.0));
  // One element with correction 1: 0/0 = nan, as torch.
  CHECK(std::isnan(var(Tensor<double>::from_vector({3.0}, Shape{1})).item()));
  CHECK(var(Tensor<float>::from_vector({1, 3}, Shape{2}), {}, 0.0).item() == 1.0f);
  CHECK_THROWS_AS(var(Tensor<int64_t>::ones({3})), DTypeError);
  CHECK_THROWS_WITH(var(x, {}, -1.0), Contains("var: correction"));
  CHECK_THROWS_AS(var(x, {2}), IndexError);
}

TEST_CASE("gaps: var and std gradients (gradcheck)", "[gaps][reduce][gradcheck]") {
  for (double c : {0.0, 1.0}) {
    INFO("correction " << c);
    auto r = testing::gradcheck([c](const std::vector<AnyTensor>& in) { return op::var(in[0], {1}, c, true); },
                                testing::random_inputs({{3, 4}}, 11));
    CHECK(r.ok);
    auto s = testing::gradcheck([c](const std::vector<AnyTensor>& in) { return op::std(in[0], {0}, c); },
                                testing::random_inputs({{3, 4}}, 12));
    CHECK(s.ok);
    auto all = testing::gradcheck([c](const std::vector<AnyTensor>& in) { return op::std(in[0], {}, c); },
                                  testing::random_inputs({{2, 3, 2}}, 13));
    CHECK(all.ok);
  }
}

namespace {
class Block : public nn::ModuleBase<Block> {
 public:
  Block() {
    fc = register_module("fc", std::make_shared<nn::Linear>(4, 3));
    act = register_module("act", std::make_shared<nn::ReLU>());
    scale = register_parameter("scale", Tensor<float>::ones({3}));
  }
  std::string type_name() const override { return "Block"; }
  template <class T>
  Tensor<T> forward(const Tensor<T>& x) {
    return (*act)((*fc)(x));
  }
  std::shared_ptr<nn::Linear> fc;
  std::shared_ptr<nn::ReLU> act;
  AnyTensor scale;
};
}  // namespace

TEST_CASE("gaps: named_modules lists the tree depth first, shared modules once", "[gaps][module]") {
  auto shared = std::make_shared<nn::Linear>(3, 3);
  nn::Sequential seq(std::make_shared<Block>(), shared, shared);
  auto mods = seq.named_modules();
  std::vector<std::string> names;
  for (auto& [n, m] : mods) names.push_back(n);
  CHECK(names == std::vector<std::string>{"", "0", "0.fc", "0.act", "1"});
  CHECK(mods[0].second == &seq);
  CHECK(mods[4].second == shared.get());
  CHECK(mods[2].second->type_name() == "Linear");
  // The modules are live: switching one to eval mode shows.
  mods[3].second->eval();
  CHECK_FALSE(seq[0].named_children()[1].second->is_training());
}

TEST_CASE("gaps: printing a module gives its tree with shapes and parameter counts", "[gaps][module]") {
  nn::Sequential seq(std::make_shared<Block>(), std::make_shared<nn::Linear>(3, 2, nn::LinearOptions{.bias = false}));
  std::ostringstream os;
  os << seq;
  const std::string want =
      "Sequential(  # 24 parameters\n"
      "  (0): Block(  # 18 parameters\n"
      "    scale=[3]\n"
      "    (fc): Linear(weight=[3, 4], bias=[3])  # 15 parameters\n"
      "    (act): ReLU()\n"
      "  )\n"
      "  (1): Linear(weight=[2, 3])  # 6 parameters\n"
      ")";
  CHECK(os.str() == want);
  std::ostringstream leaf;
  leaf << nn::ReLU();
  CHECK(leaf.str() == "ReLU()");
}

TEST_CASE("gaps: a std::vector<int64_t> serves as a Shape", "[gaps][core]") {
  const std::vector<int64_t> dims{2, 3};
  auto t = Tensor<float>::from_vector({1, 2, 3, 4, 5, 6}, dims);
  CHECK(t.shape() == Shape{2, 3});
  CHECK(Tensor<double>::zeros(dims).numel() == 6);
  CHECK(t.reshape(std::vector<int64_t>{3, 2}).shape() == Shape{3, 2});
  Shape s = dims;
  CHECK(s.vec() == dims);
  CHECK_THROWS_AS(Tensor<float>::from_vector({1, 2}, dims), ShapeError);
  CHECK_THROWS_AS(Shape(std::vector<int64_t>{2, -1}), ShapeError);
}

TEST_CASE("gaps: mse_loss broadcasts its target as PyTorch does, warning once", "[gaps][loss]") {
  // torch: mse_loss(input [3, 1], target [3]) broadcasts to [3, 3] (usually a mistake: it warns).
  auto x = Tensor<double>::from_vector({1, 2, 3}, Shape{3, 1}).set_requires_grad(true);
  auto t = Tensor<double>::from_vector({1, 2, 4}, Shape{3});
  std::ostringstream captured;
  auto* old = std::cerr.rdbuf(captured.rdbuf());
  auto none = nn::functional::mse_loss(x, t, "none");
  auto mean = nn::functional::mse_loss(x, t);
  std::cerr.rdbuf(old);
  CHECK(none.shape() == Shape{3, 3});
  // rows: (x_i - t_j)^2 = [0 1 9; 1 0 4; 4 1 1] -> mean 21 / 9
  testing::check_close(none.to_double_vector(), {0, 1, 9, 1, 0, 4, 4, 1, 1}, 1e-12);
  CHECK(mean.item() == Approx(21.0 / 9.0));
  mean.backward();  // d/dx_i = 2/9 sum_j (x_i - t_j)
  testing::check_close(x.grad().to_double_vector(), {2.0 / 9 * -4, 2.0 / 9 * -1, 2.0 / 9 * 2}, 1e-12);
  const std::string w = captured.str();
  CHECK_THAT(w, Contains("mse_loss: Using a target size ([3]) that is different to the input size ([3, 1])") &&
                    Contains("broadcasting"));
  // Once: the second call (above, "mean") and later ones print nothing more.
  CHECK(w.find("Using a target size") == w.rfind("Using a target size"));
  // l1 and smooth_l1 broadcast too; shapes that cannot broadcast raise.
  std::cerr.rdbuf(captured.rdbuf());
  CHECK(nn::functional::l1_loss(x, t).item() == Approx(11.0 / 9.0));
  std::cerr.rdbuf(old);
  CHECK_THROWS_AS(nn::functional::mse_loss(x, Tensor<double>::zeros({2, 2})), ShapeError);
  // Equal shapes: no warning, unchanged result.
  std::ostringstream quiet;
  std::cerr.rdbuf(quiet.rdbuf());
  CHECK(nn::functional::smooth_l1_loss(t, t).item() == 0.0);
  std::cerr.rdbuf(old);
  CHECK(quiet.str().empty());
}
