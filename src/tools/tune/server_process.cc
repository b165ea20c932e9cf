#include "tools/tune/server_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "base/file_util.h"
#include "tools/bench/http_client.h"

namespace stoke::tune {

namespace {

std::string LogTail(const std::string& path) {
  StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) return "";
  std::string t = *text;
  if (t.size() > 1500) t = "..." + t.substr(t.size() - 1500);
  return t;
}

}  // namespace

std::string SelfExe() {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("/proc/self/exe") : p.string();
}

ServerProcess::~ServerProcess() {
  Stop();
}

Status ServerProcess::Start(const std::string& exe, const std::vector<std::string>& args,
                            const std::string& log_path, double ready_timeout_s) {
  Stop();
  log_path_ = log_path;
  std::vector<std::string> argv_s = {exe, "serve"};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return InternalError("cannot open {}", log_path);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fd);
    return InternalError("fork failed");
  }
  if (pid == 0) {
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    const int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, 0);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(fd);
  pid_ = pid;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(ready_timeout_s);
  const std::string marker = "listening on http://";
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return UnavailableError("stoke serve exited (status {}) before it was ready; its log ({}):\n{}", status,
                              log_path, LogTail(log_path));
    }
    if (url_.empty()) {
      StatusOr<std::string> text = ReadFileToString(log_path);
      if (text.ok()) {
        if (size_t at = text->find(marker); at != std::string::npos) {
          const size_t end = text->find_first_of(" \n", at + marker.size());
          const size_t from = at + 13;  // "listening on "
          url_ = text->substr(from, end - from);
        }
      }
    }
    if (!url_.empty()) {
      StatusOr<bench::HttpEndpoint> ep = bench::ParseHttpUrl(url_);
      if (!ep.ok()) return ep.status();
      StatusOr<bench::SimpleResponse> r = bench::HttpFetch(*ep, "GET", "/health/ready", "", 5);
      if (r.ok() && r->status == 200) return OkStatus();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  }
  Stop();
  return DeadlineExceededError("stoke serve was not ready after {} s; its log ({}):\n{}", ready_timeout_s,
                               log_path, LogTail(log_path));
}

void ServerProcess::Stop() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGTERM);
  for (int i = 0; i < 3000; ++i) {  // 30 s hang guard
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      url_.clear();
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid_, SIGKILL);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
  url_.clear();
}

}  // namespace stoke::tune
