#pragma once
// File formats: atomic writes and safetensors.
#include "ember/io/atomic_file.hpp"
#include "ember/io/safetensors.hpp"
#include "ember/io/safetensors_header.hpp"
