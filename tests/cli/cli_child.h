// Helpers shared by the tests that run the `shardwild` binary
// (SHARDWILD_BINARY) as a child process: the Child process wrapper, a
// scratch directory, reading its output, and /dev/shm listings.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gtest/gtest.h"

namespace shardwild::clitest {

namespace fs = std::filesystem;
using nlohmann::json;

inline constexpr char kConfig[] = SHARDWILD_SOURCE_DIR "/configs/fashion_mnist_mlp.yaml";

inline bool HaveFashionMnist() {
  const std::string dir = "/usr/share/datasets/fashion-mnist/";
  for (const char* prefix : {"train", "t10k"}) {
    for (const char* kind : {"-images-idx3-ubyte", "-labels-idx1-ubyte"}) {
      const std::string base = dir + prefix + kind;
      if (!fs::exists(base + ".gz") && !fs::exists(base)) return false;
    }
  }
  return true;
}

inline std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::string line;
  std::istringstream in(text);
  while (std::getline(in, line)) lines.push_back(line);
  return lines;
}

// Names in /dev/shm that contain `part`.
inline std::vector<std::string> ShmEntriesContaining(const std::string& part) {
  std::vector<std::string> found;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator("/dev/shm", ec)) {
    const std::string name = e.path().filename().string();
    if (name.find(part) != std::string::npos) found.push_back(name);
  }
  return found;
}

// Removes the shared-memory segments that process `pid` of job `job_name`
// left when it was SIGKILLed ("<job>-<pid>-<nonce>-..."), as a test that
// kills a process on purpose cleans up after it: otherwise the next test of
// that job finds them stale and removes them with a warning on stderr, and a
// failure of the killing test spills into the next one's output checks.
inline void RemoveSegmentsOf(const std::string& job_name, pid_t pid) {
  const std::string prefix = job_name + "-" + std::to_string(pid) + "-";
  for (const std::string& name : ShmEntriesContaining(prefix)) {
    if (name.rfind(prefix, 0) == 0) {
      std::error_code ec;
      fs::remove(fs::path("/dev/shm") / name, ec);
    }
  }
}

// A scratch directory, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "shardwild_cli_test.XXXXXX").string();
    if (mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// A `shardwild` child process whose stdout and stderr go to files.
class Child {
 public:
  // Starts SHARDWILD_BINARY with `args`; stdin is /dev/null. With a
  // `prefix` (a program and its arguments, e.g. {"/usr/sbin/ip", "netns",
  // "exec", "ns1"}), that program runs the binary.
  explicit Child(const std::vector<std::string>& args, const std::vector<std::string>& prefix = {}) {
    if (dir_.path().empty()) return;
    out_path_ = dir_.path() / "stdout";
    err_path_ = dir_.path() / "stderr";
    std::vector<std::string> argv_s = prefix;
    argv_s.push_back(SHARDWILD_BINARY);
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 1, out_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_addopen(&actions, 2, err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
  }
  ~Child() {
    if (running()) {
      kill(pid_, SIGKILL);
      Wait();
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  bool started() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0 && !status_; }

  // Waits for the child to end and returns its wait status.
  int Wait() {
    if (!status_ && pid_ > 0) {
      int st = 0;
      while (waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
      }
      status_ = st;
    }
    return status_.value_or(-1);
  }
  // Whether the child has ended (reaping it if so).
  bool Poll() {
    if (status_) return true;
    int st = 0;
    if (waitpid(pid_, &st, WNOHANG) == pid_) status_ = st;
    return status_.has_value();
  }

  // For failure messages: "running", "exited with N" or "killed by signal
  // N (name)" (a rank that ends with no word on stderr was killed).
  std::string state() {
    if (!Poll()) return "running";
    if (WIFEXITED(*status_)) return "exited with " + std::to_string(WEXITSTATUS(*status_));
    if (WIFSIGNALED(*status_)) {
      return "killed by signal " + std::to_string(WTERMSIG(*status_)) + " (" + strsignal(WTERMSIG(*status_)) + ")";
    }
    return "wait status " + std::to_string(*status_);
  }

  std::string out() const { return ReadFile(out_path_); }
  std::string err() const { return ReadFile(err_path_); }

 private:
  TempDir dir_;
  fs::path out_path_, err_path_;
  pid_t pid_ = -1;
  std::optional<int> status_;
};

// The last stdout line, parsed as JSON (null if it does not parse).
inline json LastLineJson(const std::string& out) {
  const std::vector<std::string> lines = Lines(out);
  if (lines.empty()) return nullptr;
  return json::parse(lines.back(), nullptr, /*allow_exceptions=*/false);
}

struct Result {
  int status = -1;  // wait status
  std::string out, err;
  bool exited() const { return WIFEXITED(status); }
  int code() const { return WIFEXITED(status) ? WEXITSTATUS(status) : -1; }
};

// Runs the CLI to the end.
inline Result RunCli(const std::vector<std::string>& args) {
  Child child(args);
  Result r;
  if (!child.started()) return r;
  r.status = child.Wait();
  r.out = child.out();
  r.err = child.err();
  return r;
}

// Checks the error contract: a non-zero exit and exactly one stderr line,
// "shardwild: error: ...", containing each of `parts`.
inline void ExpectOneErrorLine(const Result& r, const std::vector<std::string>& parts) {
  EXPECT_TRUE(r.exited()) << "status " << r.status;
  EXPECT_NE(r.code(), 0);
  const std::vector<std::string> lines = Lines(r.err);
  ASSERT_EQ(lines.size(), 1u) << "stderr:\n" << r.err;
  EXPECT_EQ(lines[0].rfind("shardwild: error: ", 0), 0u) << lines[0];
  for (const std::string& p : parts) EXPECT_NE(lines[0].find(p), std::string::npos) << lines[0] << "\nlacks: " << p;
  EXPECT_EQ(r.err.back(), '\n');
}

}  // namespace shardwild::clitest
