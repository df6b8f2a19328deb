// The finite-difference gradient check (tests/gradcheck.hpp: central differences in float64 on
// the CPU, .grad prefilled so that a backward that overwrites instead of adding fails) of every
// differentiable case in the registry of op cases (tests/op_cases.hpp), once per seed of its op:
// one test per op, "gradcheck float64: <op>".
#include <catch2/catch.hpp>

#include <set>
#include <string>

#include "gradcheck.hpp"
#include "op_cases.hpp"

using namespace ember;
using namespace ember::testing;

namespace {

bool has_gradcheck(const OpSpec& op) {
  for (const OpCase& c : op.cases)
    if (c.differentiable && c.gradcheck) return true;
  return false;
}

void check_gradients(const OpSpec& op) {
  for (const OpCase& c : op.cases) {
    if (!c.differentiable || !c.gradcheck) continue;
    for (uint64_t seed : op.seeds) {
      INFO(op.name << ": " << c.variant << ", seed " << seed);
      CHECK_GRADIENTS(c.fn, case_inputs(c, seed, DType::Float64));
    }
  }
}

const bool registered = [] {
  for (const OpSpec& op : op_registry())
    if (has_gradcheck(op))
      register_test_case("gradcheck float64: " + op.name, "[gradcheck][" + op.family + "]",
                         [&op] { check_gradients(op); });
  return true;
}();

}  // namespace

TEST_CASE("op registry: each op once, in a family, its cases labelled apart", "[gradcheck][registry]") {
  std::set<std::string> names;
  for (const OpSpec& op : op_registry()) {
    INFO("op " << op.name);
    CHECK(names.insert(op.name).second);
    CHECK(op.name.find(';') == std::string::npos);  // ctest would cut the test's name there
    CHECK_FALSE(op.family.empty());
    CHECK((op.cases.size() + op.bad.size() + op.nan.size()) > 0);
    std::set<std::string> variants;
    for (const OpCase& c : op.cases) {
      INFO("case " << c.variant);
      CHECK(variants.insert(c.variant).second);
      CHECK(static_cast<bool>(c.fn));
      CHECK_FALSE(c.inputs.empty());
    }
    for (const NanCheck& n : op.nan) {
      INFO("nan check " << n.what);
      CHECK(n.values.size() == n.shapes.size());
      CHECK((n.want_grads.empty() || n.want_grads.size() == n.values.size()));
    }
  }
}
