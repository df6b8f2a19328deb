#pragma once
// ember's version. CMake parses the three EMBER_VERSION_* lines below; keep their form.
#define EMBER_VERSION_MAJOR 0
#define EMBER_VERSION_MINOR 1
#define EMBER_VERSION_PATCH 0

namespace ember {
inline constexpr int kVersionMajor = EMBER_VERSION_MAJOR;
inline constexpr int kVersionMinor = EMBER_VERSION_MINOR;
inline constexpr int kVersionPatch = EMBER_VERSION_PATCH;
inline constexpr const char* kVersionString = "0.1.0";
}  // namespace ember
