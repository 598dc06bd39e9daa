#pragma once
// Helpers for the safetensors tests: a temporary directory, raw file bytes,
// hand-built files, and "throws tiermoe::Error mentioning X".
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "tiermoe/core/error.h"

namespace tiermoe::testing {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "tiermoe-st-XXXXXX").string();
    char* made = ::mkdtemp(tmpl.data());
    if (!made) throw std::runtime_error("mkdtemp failed for " + tmpl);
    path_ = made;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

inline std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[size_t(i)] = char((v >> (8 * i)) & 0xff);
  return s;
}

// A safetensors file from a literal header and `data_bytes` bytes of data
// (a fixed pattern), without the writer's padding or sorting.
inline std::string safetensors_bytes(const std::string& header, size_t data_bytes) {
  std::string data(data_bytes, '\0');
  for (size_t i = 0; i < data_bytes; ++i) data[i] = char((i * 37 + 11) & 0xff);
  return le64(header.size()) + header + data;
}

// One tensor entry of a header: "name":{"dtype":...,"shape":...,"data_offsets":[b,e]}.
inline std::string header_entry(const std::string& name, const std::string& dtype,
                                const std::string& shape, uint64_t begin, uint64_t end) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape +
         ",\"data_offsets\":[" + std::to_string(begin) + "," + std::to_string(end) + "]}";
}

// A JSON object from its members: {a,b,...}.
inline std::string json_object(std::initializer_list<std::string> members) {
  std::string s = "{";
  for (const std::string& m : members) {
    if (s.size() > 1) s += ',';
    s += m;
  }
  s += '}';
  return s;
}

// Passes when `fn` throws tiermoe::Error whose text contains every one of
// `needles`; reports the actual message otherwise.
inline ::testing::AssertionResult throws_error_with(const std::function<void()>& fn,
                                                    const std::vector<std::string>& needles) {
  try {
    fn();
  } catch (const Error& e) {
    std::string text = e.what();
    for (const std::string& needle : needles) {
      if (text.find(needle) == std::string::npos) {
        return ::testing::AssertionFailure()
               << "error message lacks \"" << needle << "\": " << text;
      }
    }
    return ::testing::AssertionSuccess();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw a non-tiermoe exception: " << e.what();
  }
  return ::testing::AssertionFailure() << "did not throw";
}

}  // namespace tiermoe::testing
