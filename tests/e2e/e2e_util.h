// Helpers for the end-to-end tests: run the `tessera` CLI as a child process with stdout and
// stderr captured to files (so stdout is never a terminal), read JSON logs, make scratch dirs.
#pragma once
#include <spawn.h>
#include <fcntl.h>
#include <pty.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

extern char** environ;

namespace e2e {

namespace fs = std::filesystem;
using json = nlohmann::json;

inline std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void write_file(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << s;
}

// A fresh scratch directory, removed when the object goes out of scope (kept when the
// environment sets TESSERA_E2E_KEEP, for debugging).
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "tessera-e2e.XXXXXX").string();
    char* p = mkdtemp(tmpl.data());
    if (!p) std::abort();
    path_ = p;
  }
  ~TempDir() {
    if (!std::getenv("TESSERA_E2E_KEEP")) {
      std::error_code ec;
      fs::remove_all(path_, ec);
    }
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }
  fs::path operator/(const std::string& s) const { return path_ / s; }

 private:
  fs::path path_;
};

struct Result {
  bool exited = false;  // false: killed by a signal (crash, abort)
  int code = -1;        // exit status when exited
  int signal = 0;       // the signal when !exited
  std::string out, err;
  std::string describe() const {
    std::string s = exited ? "exit " + std::to_string(code) : "killed by signal " + std::to_string(signal);
    return s + "\n--- stdout ---\n" + out.substr(0, 4000) + "\n--- stderr ---\n" + err.substr(0, 4000);
  }
};

// Runs `exe args...` with stdin from /dev/null and stdout/stderr into files under `dir`.
inline Result run(const std::string& exe, const std::vector<std::string>& args, const fs::path& dir) {
  static int counter = 0;
  ++counter;
  // Never leave core files behind, whatever happens to the child.
  rlimit no_core{0, 0};
  setrlimit(RLIMIT_CORE, &no_core);
  fs::path out = dir / ("stdout." + std::to_string(counter)), err = dir / ("stderr." + std::to_string(counter));
  std::vector<std::string> argv_s{exe};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = 0;
  Result r;
  int rc = posix_spawn(&pid, exe.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    r.err = "posix_spawn failed: " + std::to_string(rc);
    return r;
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
  }
  r.exited = WIFEXITED(status);
  r.code = r.exited ? WEXITSTATUS(status) : -1;
  r.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  r.out = read_file(out);
  r.err = read_file(err);
  return r;
}

// Runs `exe args...` with stdout and stderr on a pseudo-terminal; returns what it printed
// (the terminal turns "\n" into "\r\n").
inline Result run_in_terminal(const std::string& exe, const std::vector<std::string>& args) {
  std::vector<std::string> argv_s{exe};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  Result r;
  int master = -1;
  pid_t pid = forkpty(&master, nullptr, nullptr, nullptr);
  if (pid < 0) {
    r.err = "forkpty failed";
    return r;
  }
  if (pid == 0) {
    execv(exe.c_str(), argv.data());
    _exit(127);
  }
  char buf[4096];
  for (;;) {
    ssize_t n = read(master, buf, sizeof buf);
    if (n > 0) r.out.append(buf, size_t(n));
    else if (n < 0 && errno == EINTR) continue;
    else break;  // EIO once the child has exited and closed the terminal
  }
  close(master);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.exited = WIFEXITED(status);
  r.code = r.exited ? WEXITSTATUS(status) : -1;
  r.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  return r;
}

inline Result cli(const std::vector<std::string>& args, const fs::path& dir) { return run(TESSERA_CLI, args, dir); }

inline std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> r;
  std::stringstream ss(s);
  std::string l;
  while (std::getline(ss, l)) r.push_back(l);
  return r;
}

// Every line of a --log-json file, parsed (a line that does not parse throws).
inline std::vector<json> read_log(const fs::path& p) {
  std::vector<json> r;
  for (const std::string& l : lines_of(read_file(p)))
    if (!l.empty()) r.push_back(json::parse(l));
  return r;
}

// The bigram conditional entropy H(next byte | byte) in nats of Debian's fortunes corpus: every
// regular (non-symlink) file of /usr/share/games/fortunes except the .dat indexes, in name
// order, concatenated. Computed here independently of the library.
inline const char* kFortunes = "/usr/share/games/fortunes";
inline std::string fortunes_text() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(kFortunes, ec)) {
    if (!fs::is_regular_file(e.symlink_status())) continue;
    std::string n = e.path().filename().string();
    if (n.size() >= 4 && n.substr(n.size() - 4) == ".dat") continue;
    names.push_back(n);
  }
  std::sort(names.begin(), names.end());
  std::string text;
  for (auto& n : names) text += read_file(fs::path(kFortunes) / n);
  return text;
}
inline double bigram_entropy_nats(const std::string& text) {
  std::vector<double> pair(256 * 256, 0.0), first(256, 0.0);
  for (size_t i = 0; i + 1 < text.size(); ++i) {
    unsigned a = static_cast<unsigned char>(text[i]), b = static_cast<unsigned char>(text[i + 1]);
    pair[a * 256 + b] += 1;
    first[a] += 1;
  }
  double n = double(text.size() - 1), h = 0;
  for (unsigned a = 0; a < 256; ++a)
    for (unsigned b = 0; b < 256; ++b)
      if (double c = pair[a * 256 + b]; c > 0) h -= (c / n) * std::log(c / first[a]);
  return h;
}

}  // namespace e2e
