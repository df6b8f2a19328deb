// ember's compiled library (EMBER_COMPILED_LIB, core/macros.hpp): nn::Module's bookkeeping and the
// layers' untyped forwards (nn/nn.hpp, EMBER_NN_LAYERS), compiled once.
#include "ember/src/library_unit.hpp"

#include "ember/nn/detail/module_impl.hpp"
#include "ember/nn/nn.hpp"

namespace ember::nn {
#define EMBER_NN_INSTANTIATE_LAYER(L) template class ModuleBase<L>;
EMBER_NN_LAYERS(EMBER_NN_INSTANTIATE_LAYER)
#undef EMBER_NN_INSTANTIATE_LAYER
}  // namespace ember::nn
