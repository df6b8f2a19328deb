#pragma once
// CRC-32C and TFRecord's masked form of it for the event-file writer: the functions live in io/
// (data's TFRecord reader uses them too, and data sits below logging); logging names them here.
#include "ember/io/crc32c.hpp"

namespace ember::logging {
using io::crc32c;
using io::mask_crc32c;
using io::unmask_crc32c;
}  // namespace ember::logging
