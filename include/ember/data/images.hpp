#pragma once
// PNG and JPEG decoding (libpng, libjpeg-turbo: link PNG::PNG and JPEG::JPEG in CMake, or
// -lpng -ljpeg: CMake's FindPNG / FindJPEG) and the image-folder dataset
// root/<class>/<file>.png|jpg. Images decode to uint8 [H, W, C] (C = 1 gray, 3 RGB, 4 RGBA as
// stored; 16-bit PNGs are reduced to 8 bits). Corrupt or truncated files are FormatErrors naming
// the file; never a crash (libjpeg's fatal errors are turned into exceptions through longjmp out
// of its error handler, before any C++ object lives in the decoding frame).
// jpeglib.h uses size_t and FILE without including their headers.
#include <cstddef>
#include <cstdio>

#include <jpeglib.h>
#include <png.h>

#include <algorithm>
#include <cctype>
#include <csetjmp>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "ember/core/error.hpp"
#include "ember/core/tensor.hpp"
#include "ember/data/dataset.hpp"
#include "ember/data/read_file.hpp"

namespace ember::data {

// Images larger than this (pixels) are refused: a corrupt header must not ask for all memory.
inline constexpr int64_t kMaxImagePixels = int64_t{1} << 28;

inline bool is_png(const uint8_t* d, size_t n) { return n >= 8 && png_sig_cmp(d, 0, 8) == 0; }
inline bool is_jpeg(const uint8_t* d, size_t n) { return n >= 3 && d[0] == 0xFF && d[1] == 0xD8 && d[2] == 0xFF; }

inline AnyTensor decode_png(const uint8_t* data, size_t size, const std::string& source) {
  png_image img;
  std::memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&img, data, size)) {
    const std::string msg = img.message;
    png_image_free(&img);
    throw FormatError(::ember::detail::str_cat("png: '", source, "': ", msg));
  }
  // Keep the stored channels (gray, gray+alpha, RGB, RGBA), 8 bits each.
  const bool color = (img.format & PNG_FORMAT_FLAG_COLOR) != 0;
  const bool alpha = (img.format & PNG_FORMAT_FLAG_ALPHA) != 0;
  img.format = color ? (alpha ? PNG_FORMAT_RGBA : PNG_FORMAT_RGB) : (alpha ? PNG_FORMAT_GA : PNG_FORMAT_GRAY);
  const int64_t c = PNG_IMAGE_PIXEL_CHANNELS(img.format);
  const int64_t h = img.height, w = img.width;
  if (h * w > kMaxImagePixels) {
    png_image_free(&img);
    throw FormatError(::ember::detail::str_cat("png: '", source, "': ", w, "x", h, " pixels is more than the limit of ",
                                               kMaxImagePixels));
  }
  AnyTensor t = AnyTensor::empty({h, w, c}, DType::UInt8);
  if (!png_image_finish_read(&img, nullptr, t.data_ptr(), 0, nullptr)) {
    const std::string msg = img.message;
    png_image_free(&img);
    throw FormatError(::ember::detail::str_cat("png: '", source, "': ", msg));
  }
  return t;
}

namespace detail {
struct JpegError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};
inline void jpeg_error_exit(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->message);
  std::longjmp(e->jump, 1);
}
inline void jpeg_quiet(j_common_ptr, int) {}

// The C part: no C++ object with a destructor lives here, so longjmp out of it is safe. Returns
// false with `message` set on failure. Pass 1 (out == nullptr) reads the header only.
inline bool jpeg_decode_c(const uint8_t* data, size_t size, uint8_t* out, int* h, int* w, int* c, char* message,
                          int64_t max_pixels) {
  jpeg_decompress_struct cinfo;
  JpegError err;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = jpeg_error_exit;
  err.mgr.emit_message = jpeg_quiet;
  err.message[0] = 0;
  if (setjmp(err.jump)) {
    std::strcpy(message, err.message);
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, const_cast<unsigned char*>(data), static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  if (cinfo.num_components != 1) cinfo.out_color_space = JCS_RGB;
  jpeg_calc_output_dimensions(&cinfo);
  *h = static_cast<int>(cinfo.output_height);
  *w = static_cast<int>(cinfo.output_width);
  *c = cinfo.out_color_space == JCS_GRAYSCALE ? 1 : 3;
  if (static_cast<int64_t>(*h) * *w > max_pixels) {
    std::strcpy(message, "image larger than the pixel limit");
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  if (out == nullptr) {
    jpeg_destroy_decompress(&cinfo);
    return true;
  }
  jpeg_start_decompress(&cinfo);
  const size_t stride = static_cast<size_t>(*w) * static_cast<size_t>(*c);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = out + static_cast<size_t>(cinfo.output_scanline) * stride;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return true;
}
}  // namespace detail

inline AnyTensor decode_jpeg(const uint8_t* data, size_t size, const std::string& source) {
  char message[JMSG_LENGTH_MAX + 64] = {0};
  int h = 0, w = 0, c = 0;
  EMBER_CHECK(detail::jpeg_decode_c(data, size, nullptr, &h, &w, &c, message, kMaxImagePixels), FormatError,
              "jpeg: '", source, "': ", message);
  AnyTensor t = AnyTensor::empty({h, w, c}, DType::UInt8);
  EMBER_CHECK(detail::jpeg_decode_c(data, size, static_cast<uint8_t*>(t.data_ptr()), &h, &w, &c, message,
                                    kMaxImagePixels),
              FormatError, "jpeg: '", source, "': ", message);
  return t;
}

// PNG or JPEG, by the leading bytes.
inline AnyTensor decode_image(const uint8_t* data, size_t size, const std::string& source) {
  if (is_png(data, size)) return decode_png(data, size, source);
  if (is_jpeg(data, size)) return decode_jpeg(data, size, source);
  throw FormatError(::ember::detail::str_cat("image: '", source, "' is neither PNG nor JPEG (",
                                             size < 4 ? "shorter than a signature" : "unknown signature", ")"));
}
inline AnyTensor read_image(const std::string& path) {
  std::vector<uint8_t> b = read_file_bytes(path);
  return decode_image(b.data(), b.size(), path);
}

// root/<class>/<file>.png|.jpg|.jpeg: classes are the sorted sub-folder names (label = position),
// files sorted within each. Example i: "image" uint8 [H, W, C], "label" int64. Files are read and
// decoded in get() (on the loader's workers).
class ImageFolderDataset : public Dataset {
 public:
  explicit ImageFolderDataset(const std::string& root) : root_(root) {
    namespace fs = std::filesystem;
    std::error_code ec;
    EMBER_CHECK(fs::is_directory(root, ec), IOError, "ImageFolderDataset: '", root, "' is not a folder");
    for (const auto& d : fs::directory_iterator(root)) {
      if (d.is_directory()) classes_.push_back(d.path().filename().string());
    }
    std::sort(classes_.begin(), classes_.end());
    for (size_t k = 0; k < classes_.size(); ++k) {
      std::vector<std::string> files;
      for (const auto& f : fs::directory_iterator(fs::path(root) / classes_[k])) {
        if (!f.is_regular_file()) continue;
        std::string ext = f.path().extension().string();
        std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char ch) { return std::tolower(ch); });
        if (ext == ".png" || ext == ".jpg" || ext == ".jpeg") files.push_back(f.path().string());
      }
      std::sort(files.begin(), files.end());
      for (auto& f : files) items_.push_back({std::move(f), static_cast<int64_t>(k)});
    }
    EMBER_CHECK(!items_.empty(), IOError, "ImageFolderDataset: no .png/.jpg files under '", root,
                "'/<class>/ (", classes_.size(), " class folders)");
  }
  int64_t size() const override { return static_cast<int64_t>(items_.size()); }
  Example get(int64_t i) const override {
    check_index(i);
    const Item& it = items_[static_cast<size_t>(i)];
    return Example{{"image", read_image(it.path)}, {"label", Tensor<int64_t>::scalar(it.label)}};
  }
  std::string name() const override { return "image_folder(" + root_ + ")"; }
  const std::vector<std::string>& classes() const { return classes_; }
  const std::string& path(int64_t i) const { return items_[static_cast<size_t>(i)].path; }
  int64_t label(int64_t i) const { return items_[static_cast<size_t>(i)].label; }

 private:
  struct Item {
    std::string path;
    int64_t label;
  };
  std::string root_;
  std::vector<std::string> classes_;
  std::vector<Item> items_;
};

// PNG encoding (for the packer and the benchmarks' small-files case): uint8 [H, W] or [H, W, C]
// with C in 1..4, 8 bits per channel.
inline std::vector<uint8_t> encode_png(const AnyTensor& image) {
  EMBER_CHECK(image.dtype() == DType::UInt8 && (image.dim() == 2 || image.dim() == 3), ValueError,
              "encode_png: expected uint8 [H, W] or [H, W, C], got ", dtype_name(image.dtype()), " ",
              image.shape().str());
  const int64_t c = image.dim() == 3 ? image.size(2) : 1;
  EMBER_CHECK(c >= 1 && c <= 4, ValueError, "encode_png: ", c, " channels (1 to 4 are supported)");
  png_image img;
  std::memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  img.width = static_cast<png_uint_32>(image.size(1));
  img.height = static_cast<png_uint_32>(image.size(0));
  img.format = c == 1 ? PNG_FORMAT_GRAY : c == 2 ? PNG_FORMAT_GA : c == 3 ? PNG_FORMAT_RGB : PNG_FORMAT_RGBA;
  png_alloc_size_t bytes = 0;
  EMBER_CHECK(png_image_write_to_memory(&img, nullptr, &bytes, 0, image.data_ptr(), 0, nullptr), FormatError,
              "encode_png: ", img.message);
  std::vector<uint8_t> out(bytes);
  EMBER_CHECK(png_image_write_to_memory(&img, out.data(), &bytes, 0, image.data_ptr(), 0, nullptr), FormatError,
              "encode_png: ", img.message);
  out.resize(bytes);
  return out;
}

}  // namespace ember::data
