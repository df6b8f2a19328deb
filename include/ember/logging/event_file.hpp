#pragma once
// TensorBoard event files, written directly (no protobuf, no TensorFlow): what
// `tensorboard --logdir` and Weights & Biases' TensorBoard sync read.
//
// A file is a sequence of TFRecords:
//   uint64 length (little endian) | uint32 masked_crc32c(length bytes) | payload | uint32 masked_crc32c(payload)
// Each payload is a serialised tensorflow.Event (tensorflow/core/util/event.proto):
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }
//   Value   { string tag = 1; float simple_value = 2; SummaryMetadata metadata = 9; TensorProto tensor = 8; }
//   SummaryMetadata { PluginData plugin_data = 1; }   PluginData { string plugin_name = 1; bytes content = 2; }
//   TensorProto { DataType dtype = 1 (DT_STRING = 7); TensorShapeProto tensor_shape = 2; repeated bytes string_val = 8; }
// Scalars are simple_value; text is a scalar DT_STRING tensor tagged with the "text" plugin, as
// tensorboard's text plugin writes it. The first record is the file_version "brain.Event:2".
//
// The reader (read_tfrecords, decode_event) is for tests and tools: it checks both CRCs and every
// length, and throws FormatError on malformed bytes rather than reading past them.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "ember/core/error.hpp"
#include "ember/logging/crc32c.hpp"
#include "ember/logging/file_write.hpp"

namespace ember::logging {

namespace pb {
// Protocol buffers wire format, the few pieces an Event needs.
inline void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7F) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}
inline void key(std::string& out, int field, int wire_type) { varint(out, (static_cast<uint64_t>(field) << 3) | wire_type); }
inline void field_varint(std::string& out, int field, uint64_t v) {
  key(out, field, 0);
  varint(out, v);
}
inline void field_double(std::string& out, int field, double v) {
  key(out, field, 1);
  uint64_t bits;
  std::memcpy(&bits, &v, 8);
  for (int i = 0; i < 8; ++i) out += static_cast<char>((bits >> (8 * i)) & 0xFF);
}
inline void field_float(std::string& out, int field, float v) {
  key(out, field, 5);
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  for (int i = 0; i < 4; ++i) out += static_cast<char>((bits >> (8 * i)) & 0xFF);
}
inline void field_bytes(std::string& out, int field, std::string_view bytes) {
  key(out, field, 2);
  varint(out, bytes.size());
  out.append(bytes.data(), bytes.size());
}

// A cursor over untrusted bytes.
class Reader {
 public:
  Reader(std::string_view data, const char* what) : data_(data), what_(what) {}
  bool done() const { return pos_ >= data_.size(); }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      EMBER_CHECK(pos_ < data_.size(), FormatError, what_, ": truncated varint at byte ", pos_);
      const auto b = static_cast<unsigned char>(data_[pos_++]);
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
    throw FormatError(std::string(what_) + ": varint longer than 10 bytes");
  }
  uint64_t fixed(int bytes) {
    EMBER_CHECK(data_.size() - pos_ >= static_cast<size_t>(bytes), FormatError, what_, ": truncated fixed", 8 * bytes,
                " at byte ", pos_);
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(data_[pos_++])) << (8 * i);
    return v;
  }
  std::string_view bytes() {
    const uint64_t n = varint();
    EMBER_CHECK(n <= data_.size() - pos_, FormatError, what_, ": a length of ", n, " at byte ", pos_, " runs past the ",
                data_.size(), " bytes");
    std::string_view s = data_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  // Skips a field of the given wire type.
  void skip(int wire_type) {
    switch (wire_type) {
      case 0: varint(); return;
      case 1: fixed(8); return;
      case 2: bytes(); return;
      case 5: fixed(4); return;
      default: throw FormatError(std::string(what_) + ": unsupported wire type " + std::to_string(wire_type));
    }
  }

 private:
  std::string_view data_;
  const char* what_;
  size_t pos_ = 0;
};
}  // namespace pb

// One TFRecord around a payload.
inline std::string tfrecord(std::string_view payload) {
  std::string out;
  char len[8];
  const uint64_t n = payload.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  auto put32 = [&](uint32_t v) {
    for (int i = 0; i < 4; ++i) out += static_cast<char>((v >> (8 * i)) & 0xFF);
  };
  out.append(len, 8);
  put32(mask_crc32c(crc32c(len, 8)));
  out.append(payload.data(), payload.size());
  put32(mask_crc32c(crc32c(payload.data(), payload.size())));
  return out;
}

// The payloads of a TFRecord stream; FormatError naming the record and byte on a bad length or CRC.
inline std::vector<std::string> read_tfrecords(std::string_view data, const std::string& name = "<buffer>") {
  std::vector<std::string> out;
  size_t pos = 0;
  auto get = [&](size_t at, int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(data[at + i])) << (8 * i);
    return v;
  };
  while (pos < data.size()) {
    EMBER_CHECK(data.size() - pos >= 12, FormatError, name, ": record ", out.size(), " at byte ", pos,
                ": truncated header (", data.size() - pos, " bytes left)");
    const uint64_t n = get(pos, 8);
    EMBER_CHECK(static_cast<uint32_t>(get(pos + 8, 4)) == mask_crc32c(crc32c(data.data() + pos, 8)), FormatError, name,
                ": record ", out.size(), " at byte ", pos, ": length CRC mismatch");
    EMBER_CHECK(n <= data.size() - pos - 12 && data.size() - pos - 12 - n >= 4, FormatError, name, ": record ",
                out.size(), " at byte ", pos, ": length ", n, " runs past the end of the file");
    const char* payload = data.data() + pos + 12;
    EMBER_CHECK(static_cast<uint32_t>(get(pos + 12 + n, 4)) == mask_crc32c(crc32c(payload, n)), FormatError, name,
                ": record ", out.size(), " at byte ", pos, ": data CRC mismatch");
    out.emplace_back(payload, n);
    pos += 12 + n + 4;
  }
  return out;
}

// ---- Event messages ----
inline std::string event_header(double wall_time) {
  std::string e;
  pb::field_double(e, 1, wall_time);
  pb::field_bytes(e, 3, "brain.Event:2");
  return e;
}

inline std::string scalar_value(std::string_view tag, float v) {
  std::string value;
  pb::field_bytes(value, 1, tag);
  pb::field_float(value, 2, v);
  return value;
}

inline std::string text_value(std::string_view tag, std::string_view text) {
  std::string plugin;
  pb::field_bytes(plugin, 1, "text");
  std::string metadata;
  pb::field_bytes(metadata, 1, plugin);
  std::string tensor;
  pb::field_varint(tensor, 1, 7);  // DT_STRING
  pb::field_bytes(tensor, 2, "");  // a scalar: a shape with no dimensions
  pb::field_bytes(tensor, 8, text);
  std::string value;
  pb::field_bytes(value, 1, tag);
  pb::field_bytes(value, 9, metadata);
  pb::field_bytes(value, 8, tensor);
  return value;
}

// An Event carrying a Summary of already-encoded Values.
inline std::string summary_event(double wall_time, int64_t step, const std::vector<std::string>& values) {
  std::string summary;
  for (const auto& v : values) pb::field_bytes(summary, 1, v);
  std::string e;
  pb::field_double(e, 1, wall_time);
  pb::field_varint(e, 2, static_cast<uint64_t>(step));
  pb::field_bytes(e, 5, summary);
  return e;
}

// What decode_event reads back.
struct DecodedValue {
  std::string tag;
  bool has_simple_value = false;
  float simple_value = 0;
  std::string plugin_name;
  std::vector<std::string> string_val;
};
struct DecodedEvent {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  std::vector<DecodedValue> values;
};

inline DecodedEvent decode_event(std::string_view payload) {
  DecodedEvent ev;
  pb::Reader r(payload, "tensorflow.Event");
  while (!r.done()) {
    const uint64_t k = r.varint();
    const int field = static_cast<int>(k >> 3), wt = static_cast<int>(k & 7);
    if (field == 1 && wt == 1) {
      const uint64_t bits = r.fixed(8);
      std::memcpy(&ev.wall_time, &bits, 8);
    } else if (field == 2 && wt == 0) {
      ev.step = static_cast<int64_t>(r.varint());
    } else if (field == 3 && wt == 2) {
      ev.file_version = std::string(r.bytes());
    } else if (field == 5 && wt == 2) {
      pb::Reader s(r.bytes(), "tensorflow.Summary");
      while (!s.done()) {
        const uint64_t sk = s.varint();
        if ((sk >> 3) != 1 || (sk & 7) != 2) {
          s.skip(static_cast<int>(sk & 7));
          continue;
        }
        DecodedValue dv;
        pb::Reader v(s.bytes(), "tensorflow.Summary.Value");
        while (!v.done()) {
          const uint64_t vk = v.varint();
          const int vf = static_cast<int>(vk >> 3), vw = static_cast<int>(vk & 7);
          if (vf == 1 && vw == 2) {
            dv.tag = std::string(v.bytes());
          } else if (vf == 2 && vw == 5) {
            const auto bits = static_cast<uint32_t>(v.fixed(4));
            std::memcpy(&dv.simple_value, &bits, 4);
            dv.has_simple_value = true;
          } else if (vf == 9 && vw == 2) {
            pb::Reader m(v.bytes(), "tensorflow.SummaryMetadata");
            while (!m.done()) {
              const uint64_t mk = m.varint();
              if ((mk >> 3) == 1 && (mk & 7) == 2) {
                pb::Reader pd(m.bytes(), "tensorflow.PluginData");
                while (!pd.done()) {
                  const uint64_t pk = pd.varint();
                  if ((pk >> 3) == 1 && (pk & 7) == 2) dv.plugin_name = std::string(pd.bytes());
                  else pd.skip(static_cast<int>(pk & 7));
                }
              } else {
                m.skip(static_cast<int>(mk & 7));
              }
            }
          } else if (vf == 8 && vw == 2) {
            pb::Reader t(v.bytes(), "tensorflow.TensorProto");
            while (!t.done()) {
              const uint64_t tk = t.varint();
              if ((tk >> 3) == 8 && (tk & 7) == 2) dv.string_val.emplace_back(t.bytes());
              else t.skip(static_cast<int>(tk & 7));
            }
          } else {
            v.skip(vw);
          }
        }
        ev.values.push_back(std::move(dv));
      }
    } else {
      r.skip(wt);
    }
  }
  return ev;
}

// Appends events to one file named as TensorFlow names them
// (events.out.tfevents.<seconds>.<host>.<pid>.<n>), each record handed to the kernel at once.
class EventFileWriter {
 public:
  explicit EventFileWriter(const std::filesystem::path& dir) {
    char host[256] = "localhost";
    ::gethostname(host, sizeof host - 1);
    static std::atomic<int> counter{0};
    const auto now = std::chrono::system_clock::now().time_since_epoch();
    const long long secs = std::chrono::duration_cast<std::chrono::seconds>(now).count();
    path_ = dir / ("events.out.tfevents." + std::to_string(secs) + "." + host + "." + std::to_string(::getpid()) + "." +
                   std::to_string(counter.fetch_add(1)));
    file_ = AppendFile(path_);
    file_.append(tfrecord(event_header(wall_time_now())));
  }
  void write(std::string_view event) { file_.append(tfrecord(event)); }
  void flush() { file_.sync(); }
  void close() { file_.close(); }
  const std::filesystem::path& path() const { return path_; }

  static double wall_time_now() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  }

 private:
  std::filesystem::path path_;
  AppendFile file_;
};

}  // namespace ember::logging
