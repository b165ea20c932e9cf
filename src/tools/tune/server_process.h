// A `stoke serve` child process for one tuning point: started with the knob values as flags on a free port
// (--port 0; the URL comes from its "listening on" line), ready when GET /health/ready answers 200, stopped
// with SIGTERM (SIGKILL after a hang guard). Its stderr goes to a log file, which an error quotes.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "base/status.h"

namespace stoke::tune {

class ServerProcess {
 public:
  ServerProcess() = default;
  ~ServerProcess();  // Stop()
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  // exe: the stoke binary; args: after "serve". Waits (up to ready_timeout_s, a hang guard) for readiness.
  Status Start(const std::string& exe, const std::vector<std::string>& args, const std::string& log_path,
               double ready_timeout_s);
  const std::string& url() const { return url_; }
  // SIGTERM, wait; SIGKILL if it has not exited after 30 s. Idempotent.
  void Stop();

 private:
  pid_t pid_ = -1;
  std::string url_;
  std::string log_path_;
};

// The stoke binary running now (/proc/self/exe).
std::string SelfExe();

}  // namespace stoke::tune
