// Autograd: the tape, the engine, accumulation, grad mode, retain_graph, hooks, error cases,
// and the gradient-check harness itself (a wrong backward must fail it).
#include <catch2/catch.hpp>

#include "gradcheck.hpp"

using namespace ember;

TEST_CASE("backward of a scalar fills leaf gradients", "[autograd]") {
  auto x = Tensor<double>::from_vector({1, 2, 3}).set_requires_grad();
  auto y = sum(x * x);  // dy/dx = 2x
  CHECK(y.requires_grad());
  CHECK_FALSE(y.is_leaf());
  y.backward();
  CHECK(x.grad().to_vector() == std::vector<double>{2, 4, 6});
}

TEST_CASE("backward with an explicit gradient", "[autograd]") {
  auto x = Tensor<double>::from_vector({1, 2, 3}).set_requires_grad();
  auto y = x * 3.0;
  y.backward(Tensor<double>::from_vector({1, 10, 100}));
  CHECK(x.grad().to_vector() == std::vector<double>{3, 30, 300});
}

TEST_CASE("gradients accumulate across backward calls until zero_grad", "[autograd]") {
  auto x = Tensor<double>::from_vector({1, -1}).set_requires_grad();
  sum(x * 2.0).backward();
  sum(x * 2.0).backward();
  CHECK(x.grad().to_vector() == std::vector<double>{4, 4});
  x.zero_grad();
  CHECK_FALSE(x.grad().defined());
  sum(x * 5.0).backward();
  CHECK(x.grad().to_vector() == std::vector<double>{5, 5});
}

TEST_CASE("a leaf takes a gradient nothing else holds and copies one that is shared", "[autograd]") {
  // The caller's gradient goes to the leaf directly (y = x): it must be copied, so that changing
  // it afterwards leaves .grad alone.
  auto x = Tensor<double>::from_vector({1, 2, 3}).set_requires_grad();
  auto gy = Tensor<double>::from_vector({1, 1, 1});
  x.reshape({3}).backward(gy);
  gy.copy_(Tensor<double>::full({3}, 7.0));
  CHECK(x.grad().to_vector() == std::vector<double>{1, 1, 1});

  // add's backward hands one tensor to both leaves: at most one of them may keep it.
  auto a = Tensor<double>::from_vector({1, 2}).set_requires_grad();
  auto b = Tensor<double>::from_vector({3, 4}).set_requires_grad();
  sum(a + b).backward();
  CHECK(a.grad().data_ptr() != b.grad().data_ptr());
  a.grad().copy_(Tensor<double>::full({2}, 5.0));
  CHECK(b.grad().to_vector() == std::vector<double>{1, 1});

  // A fresh gradient (x * 3's backward output) is taken, not copied: one allocation in the
  // backward pass (the product of the gradient and 3), none for the leaf's .grad.
  auto w = Tensor<float>::from_vector(std::vector<float>(1 << 16, 1.0f), {1 << 16}).set_requires_grad();
  auto g = Tensor<float>::full({1 << 16}, 2.0);
  auto y = w * 3.0f;
  const int64_t before = memory_stats().num_allocations;
  y.backward(g);
  CHECK(memory_stats().num_allocations - before == 1);
  CHECK(w.grad().to_vector() == std::vector<float>(1 << 16, 6.0f));
}

TEST_CASE("gradients meeting at one tensor are summed correctly when added in place", "[autograd]") {
  // x reaches y by three paths, one of them a view (reshape): the buffer that collects them is
  // added into in place only when nothing else shares it.
  auto x = Tensor<double>::from_vector({1, 2, 3, 4}).set_requires_grad();
  auto r = x.reshape({2, 2}).reshape({4});
  auto y = sum(x * 2.0 + x * x + r * 10.0 + r);
  y.backward();
  CHECK(x.grad().to_vector() == std::vector<double>{15, 17, 19, 21});  // 2 + 2x + 11
  // a tensor used twice in one op (its two gradients are one tensor)
  auto z = Tensor<double>::from_vector({1, -2}).set_requires_grad();
  auto t = z * 1.0;
  sum(t + t + t).backward();
  CHECK(z.grad().to_vector() == std::vector<double>{3, 3});
}

TEST_CASE("a gradient destination receives a leaf's first gradient, later ones accumulate there", "[autograd]") {
  auto x = Tensor<double>::from_vector({1, -1}).set_requires_grad();
  auto buffer = Tensor<double>::full({5}, 7.0);  // the destination is a slice of a larger buffer
  int asked = 0;
  x.set_grad_destination([&]() -> AnyTensor {
    ++asked;
    return buffer.slice(1, 3);
  });
  sum(x * 2.0).backward();
  CHECK(asked == 1);
  CHECK(buffer.to_vector() == std::vector<double>{7, 2, 2, 7, 7});  // copied in, not added
  CHECK(x.grad().data_ptr() == buffer.slice(1, 3).data_ptr());      // .grad aliases it
  sum(x * 3.0).backward();                                          // accumulates in place
  CHECK(asked == 1);
  CHECK(buffer.to_vector() == std::vector<double>{7, 5, 5, 7, 7});
  x.zero_grad();
  sum(x * 4.0).backward();  // asked again once the gradient was dropped
  CHECK(asked == 2);
  CHECK(buffer.to_vector() == std::vector<double>{7, 4, 4, 7, 7});

  // An undefined destination: a fresh tensor, as without one.
  x.zero_grad();
  x.set_grad_destination([]() { return AnyTensor(); });
  sum(x * 1.0).backward();
  CHECK(x.grad().to_vector() == std::vector<double>{1, 1});
  CHECK(buffer.to_vector() == std::vector<double>{7, 4, 4, 7, 7});

  // A destination of the wrong shape is an error naming both tensors.
  x.zero_grad();
  x.set_grad_destination([&]() -> AnyTensor { return buffer.slice(0, 3); });
  CHECK_THROWS_WITH(sum(x * 1.0).backward(),
                    Catch::Matchers::Contains("gradient destination float64[3]") &&
                        Catch::Matchers::Contains("float64[2]"));
  // Only leaves that require grad have one.
  auto y = x * 2.0;
  CHECK_THROWS_AS(y.set_grad_destination([] { return AnyTensor(); }), AutogradError);
}

TEST_CASE("a tensor used twice gets the sum of both paths (diamond)", "[autograd]") {
  auto x = Tensor<double>::from_vector({2.0}).set_requires_grad();
  auto a = x * 3.0;
  auto b = exp(x);
  auto y = sum(a * b);  // d/dx 3x e^x = 3e^x + 3x e^x
  y.backward();
  CHECK(x.grad().item() == Approx(3 * std::exp(2.0) + 6 * std::exp(2.0)));
}

TEST_CASE("two leaves fed by the same incoming gradient do not share storage", "[autograd]") {
  auto a = Tensor<double>::from_vector({1, 2}).set_requires_grad();
  auto b = Tensor<double>::from_vector({3, 4}).set_requires_grad();
  sum(a + b).backward();
  sum(a * 2.0).backward();  // adds into a.grad only
  CHECK(a.grad().to_vector() == std::vector<double>{3, 3});
  CHECK(b.grad().to_vector() == std::vector<double>{1, 1});
}

TEST_CASE("NoGradGuard records nothing", "[autograd]") {
  auto x = Tensor<double>::from_vector({1, 2}).set_requires_grad();
  Tensor<double> y;
  {
    NoGradGuard guard;
    CHECK_FALSE(is_grad_enabled());
    y = x * 2.0;
  }
  CHECK(is_grad_enabled());
  CHECK_FALSE(y.requires_grad());
  CHECK(y.is_leaf());
  CHECK_THROWS_AS(sum(y).backward(), AutogradError);
}

TEST_CASE("detach cuts the graph", "[autograd]") {
  auto x = Tensor<double>::from_vector({1, 2}).set_requires_grad();
  auto y = (x * 2.0).detach();
  CHECK_FALSE(y.requires_grad());
  auto z = sum(x * y);
  z.backward();
  CHECK(x.grad().to_vector() == std::vector<double>{2, 4});
}

TEST_CASE("a second backward needs retain_graph", "[autograd]") {
  auto x = Tensor<double>::from_vector({1, 2}).set_requires_grad();
  auto y = sum(exp(x));
  y.backward(/*retain_graph=*/true);
  y.backward();  // allowed: the first call retained the saved tensors
  CHECK(x.grad().to_vector()[0] == Approx(2 * std::exp(1.0)));
  CHECK_THROWS_AS(y.backward(), AutogradError);
  try {
    y.backward();
  } catch (const AutogradError& e) {
    CHECK_THAT(e.what(), Catch::Contains("second time") && Catch::Contains("retain_graph"));
  }
}

TEST_CASE("backward frees saved tensors unless retain_graph", "[autograd][memory]") {
  auto x = Tensor<double>::randn({256, 256}).set_requires_grad();
  const int64_t base = memory_stats().current_bytes;
  auto y = sum(exp(x) * 2.0);  // saves exp(x) (512 KiB) in its backward
  const int64_t with_graph = memory_stats().current_bytes;
  CHECK(with_graph - base >= 256 * 256 * 8);
  y.backward();
  x.zero_grad();
  CHECK(memory_stats().current_bytes - base < 256 * 256 * 8);
}

TEST_CASE("backward on a non-scalar without a gradient is an error", "[autograd]") {
  auto x = Tensor<double>::from_vector({1, 2}).set_requires_grad();
  auto y = x * 2.0;
  CHECK_THROWS_AS(y.backward(), AutogradError);
  try {
    y.backward();
  } catch (const AutogradError& e) {
    CHECK_THAT(e.what(), Catch::Contains("non-scalar") && Catch::Contains("float64[2]"));
  }
  CHECK_THROWS_AS(y.backward(Tensor<double>::ones({3})), ShapeError);
}

TEST_CASE("requires_grad only on floating leaves", "[autograd]") {
  auto i = Tensor<int64_t>::arange(3);
  CHECK_THROWS_AS(i.set_requires_grad(), DTypeError);
  auto x = Tensor<double>::from_vector({1.0}).set_requires_grad();
  auto y = x * 2.0;
  CHECK_THROWS_AS(y.set_requires_grad(), AutogradError);
}

TEST_CASE("gradient-ready hooks fire once per leaf after accumulation", "[autograd][hooks]") {
  auto w1 = Tensor<double>::from_vector({1, 2}).set_requires_grad();
  auto w2 = Tensor<double>::from_vector({3}).set_requires_grad();
  std::vector<std::string> fired;
  std::vector<double> seen;
  w1.register_grad_ready_hook([&](const AnyTensor& p) {
    fired.push_back("w1");
    seen.push_back(p.grad().to_double_vector()[0]);
  });
  w2.register_grad_ready_hook([&](const AnyTensor&) { fired.push_back("w2"); });
  // w1 is used twice: its hook must fire once, after both contributions are summed.
  auto h = w1 * 2.0 + w1;
  auto y = sum(h * w2);
  y.backward();
  REQUIRE(fired.size() == 2);
  CHECK(std::count(fired.begin(), fired.end(), "w1") == 1);
  CHECK(seen[0] == 9.0);  // 3 * w2 = 9
  CHECK_THROWS_AS((w1 * 2.0).register_grad_ready_hook([](const AnyTensor&) {}), AutogradError);
}

TEST_CASE("multi-output ops: an unused output contributes zeros", "[autograd]") {
  auto x = Tensor<double>::arange(6).reshape({6}).set_requires_grad();
  auto parts = split(x, {2, 4});
  sum(parts[1] * 3.0).backward();
  CHECK(x.grad().to_vector() == std::vector<double>{0, 0, 3, 3, 3, 3});
}

TEST_CASE("custom ops recorded with autograd::record", "[autograd][custom]") {
  // y = x^3 written as a custom op with its own backward.
  auto cube = [](const AnyTensor& x) {
    AnyTensor y;
    {
      NoGradGuard ng;
      y = op::mul(op::mul(x, x), x);
    }
    AnyTensor saved = x.detach();
    autograd::record("Cube", {x}, {y}, [saved](const std::vector<AnyTensor>& g) {
      return std::vector<AnyTensor>{op::mul(g[0], op::mul(op::square(saved), 3.0))};
    });
    return y;
  };
  auto x = Tensor<double>::from_vector({2.0}).set_requires_grad();
  Tensor<double>(cube(x)).backward();
  CHECK(x.grad().item() == 12.0);
  CHECK(testing::gradcheck([&](const std::vector<AnyTensor>& in) { return cube(in[0]); },
                           testing::random_inputs({{3, 2}}, 1))
            .ok);
}

TEST_CASE("record with RecordWhen::GradEnabled records a node whose inputs need no grad", "[autograd][custom]") {
  // As nn::recompute does: the node's backward reaches a leaf (w) that is not among its inputs.
  auto w = Tensor<double>::from_vector({3.0, 4.0}).set_requires_grad();
  auto x = Tensor<double>::from_vector({1.0, 2.0});  // data: no grad
  std::vector<double> received;
  auto scaled = [&](autograd::RecordWhen when) {
    AnyTensor y;
    {
      NoGradGuard ng;
      y = op::mul(x, 2.0);
    }
    AnyTensor saved_x = x.detach();
    autograd::record(
        "ScaleIntoW", {x}, {y},
        [&received, saved_x, w](const std::vector<AnyTensor>& g) {
          received = g[0].to_double_vector();
          AnyTensor gw = op::mul(g[0], saved_x);  // as if y depended on w: dy/dw = x
          autograd::backward({AnyTensor(w)}, {gw});
          return std::vector<AnyTensor>{AnyTensor()};
        },
        when);
    return y;
  };

  AnyTensor plain = scaled(autograd::RecordWhen::InputRequiresGrad);
  CHECK_FALSE(plain.requires_grad());
  CHECK(plain.grad_fn() == nullptr);

  AnyTensor y = scaled(autograd::RecordWhen::GradEnabled);
  REQUIRE(y.grad_fn() != nullptr);
  CHECK(y.grad_fn_name() == "ScaleIntoW");
  REQUIRE(y.grad_fn()->next.size() == 1);
  CHECK_FALSE(y.grad_fn()->next[0].valid());  // x requires no grad: no edge
  CHECK(y.to_double_vector() == std::vector<double>{2.0, 4.0});
  y.backward(AnyTensor(Tensor<double>::from_vector({1.0, 10.0})));
  CHECK(received == std::vector<double>{1.0, 10.0});
  CHECK(w.grad().to_vector() == std::vector<double>{1.0, 20.0});
  CHECK_FALSE(x.grad().defined());

  {
    NoGradGuard no_grad;  // grad mode off: nothing is recorded either way
    CHECK(scaled(autograd::RecordWhen::GradEnabled).grad_fn() == nullptr);
  }
  {
    InferenceModeGuard inference;
    CHECK(scaled(autograd::RecordWhen::GradEnabled).grad_fn() == nullptr);
  }
}

TEST_CASE("gradcheck harness: a deliberately wrong backward fails it (negative control)", "[autograd][gradcheck]") {
  auto wrong = [](const AnyTensor& x) {
    AnyTensor y;
    {
      NoGradGuard ng;
      y = op::mul(x, 2.0);
    }
    autograd::record("WrongScale", {x}, {y}, [](const std::vector<AnyTensor>& g) {
      return std::vector<AnyTensor>{op::mul(g[0], 2.01)};  // should be 2: off by 0.5%, above rtol 1e-3
    });
    return y;
  };
  for (uint64_t seed : {1, 2, 3}) {
    auto r = testing::gradcheck([&](const std::vector<AnyTensor>& in) { return wrong(in[0]); },
                                testing::random_inputs({{4}}, seed));
    CHECK_FALSE(r.ok);
    CHECK(r.report.find("analytic") != std::string::npos);
  }
  // A backward that drops the gradient of one input also fails.
  auto forgets = [](const AnyTensor& a, const AnyTensor& b) {
    AnyTensor y;
    {
      NoGradGuard ng;
      y = op::mul(a, b);
    }
    AnyTensor sb = b.detach();
    autograd::record("ForgetsB", {a, b}, {y}, [sb](const std::vector<AnyTensor>& g) {
      return std::vector<AnyTensor>{op::mul(g[0], sb), AnyTensor()};
    });
    return y;
  };
  auto r = testing::gradcheck([&](const std::vector<AnyTensor>& in) { return forgets(in[0], in[1]); },
                              testing::random_inputs({{3}, {3}}, 4));
  CHECK_FALSE(r.ok);
  // And the correct op passes.
  auto good = testing::gradcheck([](const std::vector<AnyTensor>& in) { return op::mul(in[0], in[1]); },
                                 testing::random_inputs({{3}, {3}}, 4));
  CHECK(good.ok);
}

TEST_CASE("a backward returning a wrongly shaped gradient is reported", "[autograd]") {
  auto x = Tensor<double>::from_vector({1, 2}).set_requires_grad();
  AnyTensor y;
  {
    NoGradGuard ng;
    y = op::mul(x, 1.0);
  }
  autograd::record("BadShape", {x}, {y}, [](const std::vector<AnyTensor>&) {
    return std::vector<AnyTensor>{Tensor<double>::ones({3})};
  });
  CHECK_THROWS_WITH(op::sum(y).backward(), Catch::Contains("BadShape") && Catch::Contains("float64[3]"));
}

TEST_CASE("conversions are differentiable: to<U>() and clone", "[autograd]") {
  auto x = Tensor<double>::from_vector({1, 2}).set_requires_grad();
  auto y = sum(x.to<float>().to<double>() * 2.0 + x.clone());
  y.backward();
  CHECK(x.grad().to_vector() == std::vector<double>{3, 3});
  CHECK(testing::gradcheck([](const std::vector<AnyTensor>& in) { return in[0].slice(1, 3).reshape({4}); },
                           testing::random_inputs({{4, 2}}, 9))
            .ok);
}

TEST_CASE("callbacks queued during backward run once at its end, in order", "[autograd][hooks]") {
  auto w = Tensor<double>::from_vector({1, 2}).set_requires_grad();
  std::vector<std::string> events;
  w.register_grad_ready_hook([&](const AnyTensor&) {
    events.push_back("hook");
    autograd::queue_callback([&] {
      events.push_back("end 1");
      autograd::queue_callback([&] { events.push_back("end 2"); });
    });
  });
  sum(w * 3.0).backward();
  CHECK(events == std::vector<std::string>{"hook", "end 1", "end 2"});
  CHECK_THROWS_AS(autograd::queue_callback([] {}), AutogradError);
}
