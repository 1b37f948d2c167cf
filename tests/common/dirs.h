// A fresh, empty directory under the test temp dir (unit and GPU tests alike).
#pragma once
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

namespace anatomy::testing_dirs {

inline std::string fresh_dir(const std::string& name) {
  const std::filesystem::path p = std::filesystem::path(testing::TempDir()) / name;
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p.string();
}

}  // namespace anatomy::testing_dirs
