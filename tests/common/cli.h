// Running the `anatomy` binary from a test: its exit status and everything it printed.
#pragma once
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "dirs.h"

namespace anatomy::testing_cli {

struct CmdResult {
  int status = -1;  // the exit status, or 128 + the signal that ended it
  std::string output;  // stdout and stderr together
};

// step -> the training loss a run logged in DIR/metrics.jsonl.
inline std::map<int64_t, double> loss_curve(const std::string& dir) {
  std::map<int64_t, double> c;
  std::ifstream in(std::filesystem::path(dir) / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("loss")) c[j["step"].get<int64_t>()] = j["loss"].get<double>();
  }
  return c;
}

// ANATOMY_BINARY + " " + args, through the shell.
inline CmdResult run_anatomy(const std::string& args) {
  const std::string cmd = std::string(ANATOMY_BINARY) + " " + args + " 2>&1";
  CmdResult r;
  FILE* p = popen(cmd.c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

using testing_dirs::fresh_dir;

// One error line that names what is wrong; exit 2 (not a crash, not success).
inline void expect_clean_error(const CmdResult& r, const std::string& needle) {
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("error"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(needle), std::string::npos) << r.output;
}

}  // namespace anatomy::testing_cli
