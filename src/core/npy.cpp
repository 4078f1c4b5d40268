#include "core/npy.h"

#include <cstring>
#include <fstream>
#include <sstream>

namespace sparkserve {

std::string npy_header_f32(const std::vector<int64_t>& shape) {
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < shape.size(); ++i) {
    dict += std::to_string(shape[i]);
    if (shape.size() == 1 || i + 1 < shape.size()) dict += ",";
    if (i + 1 < shape.size()) dict += " ";
  }
  dict += "), }";
  // Magic (6) + version (2) + header length (2) + dict + newline must be a multiple of 64.
  size_t total = 10 + dict.size() + 1;
  size_t padded = (total + 63) / 64 * 64;
  dict.append(padded - total, ' ');
  dict += '\n';
  std::string header("\x93NUMPY\x01\x00", 8);
  uint16_t len = static_cast<uint16_t>(dict.size());
  header += static_cast<char>(len & 0xff);
  header += static_cast<char>(len >> 8);
  return header + dict;
}

Status write_npy_f32(const std::filesystem::path& path, const std::vector<int64_t>& shape,
                     const float* data) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::ofstream f(path, std::ios::binary);
  if (!f) return make_error("cannot open " + path.string() + " for writing");
  std::string header = npy_header_f32(shape);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(n * sizeof(float)));
  f.close();
  if (!f) return make_error("error writing " + path.string());
  return Status::Ok();
}

Expected<NpyArrayF32> read_npy_f32(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return make_error("cannot open " + path.string());
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  auto bad = [&](const std::string& why) { return make_error(path.string() + ": " + why); };
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0) return bad("not a .npy file");
  uint8_t major = static_cast<uint8_t>(bytes[6]);
  size_t header_len, offset;
  if (major == 1) {
    header_len = static_cast<uint8_t>(bytes[8]) | (static_cast<uint8_t>(bytes[9]) << 8);
    offset = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return bad("truncated header");
    header_len = 0;
    for (int i = 0; i < 4; ++i) header_len |= static_cast<size_t>(static_cast<uint8_t>(bytes[8 + i])) << (8 * i);
    offset = 12;
  } else {
    return bad("unsupported .npy version " + std::to_string(major));
  }
  if (bytes.size() < offset + header_len) return bad("truncated header");
  std::string dict = bytes.substr(offset, header_len);
  if (dict.find("'descr': '<f4'") == std::string::npos) return bad("dtype is not little-endian float32: " + dict);
  if (dict.find("'fortran_order': False") == std::string::npos) return bad("fortran order not supported");
  auto lp = dict.find('(', dict.find("'shape'"));
  auto rp = dict.find(')', lp);
  if (lp == std::string::npos || rp == std::string::npos) return bad("no shape in header");
  NpyArrayF32 out;
  std::stringstream ss(dict.substr(lp + 1, rp - lp - 1));
  std::string item;
  int64_t n = 1;
  while (std::getline(ss, item, ',')) {
    if (item.find_first_not_of(' ') == std::string::npos) continue;
    out.shape.push_back(std::stoll(item));
    n *= out.shape.back();
  }
  size_t data_off = offset + header_len;
  if (bytes.size() - data_off != static_cast<size_t>(n) * 4) return bad("data size does not match shape");
  out.data.resize(static_cast<size_t>(n));
  std::memcpy(out.data.data(), bytes.data() + data_off, static_cast<size_t>(n) * 4);
  return out;
}

}  // namespace sparkserve
