#include "backends/cpu/loop_dump.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>

#include "core/fail.h"

namespace tessera::backends::jit {
namespace {

namespace fs = std::filesystem;

std::mutex g_mu;  // one loop's dump at a time (the perf map, standard error)
std::atomic<int> g_next{1};

// objdump from the PATH, or empty.
std::string find_objdump() {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "");
  for (std::string d; std::getline(dirs, d, ':');)
    if (!d.empty() && access((fs::path(d) / "objdump").c_str(), X_OK) == 0) return (fs::path(d) / "objdump").string();
  return "";
}

// objdump's listing of the raw code in file `bin` as loaded at `address`, or a line saying why not.
std::string disassemble(const fs::path& bin, const void* address) {
  static const std::string objdump = find_objdump();
  if (objdump.empty()) return "; objdump not found: " + bin.string() + " holds the bytes\n";
  char vma[32];
  std::snprintf(vma, sizeof vma, "%#lx", static_cast<unsigned long>(reinterpret_cast<uintptr_t>(address)));
  const std::string cmd = "'" + objdump + "' -D -b binary -mi386:x86-64 -M intel --adjust-vma=" + vma + " '" +
                          bin.string() + "' 2>&1";
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
    if (pclose(p) != 0) out += "; objdump failed\n";
  }
  return out;
}

void write_file(const fs::path& path, const void* data, size_t size) {
  std::ofstream f(path, std::ios::binary);
  f.write(static_cast<const char*>(data), std::streamsize(size));
  if (!f) fail("dump", "cannot write '" + path.string() + "' (TESSERA_DUMP=asm)", "");
}

}  // namespace

bool dump_asm() {
  static const bool on = [] {
    const char* e = std::getenv("TESSERA_DUMP");
    std::stringstream stages(e ? e : "");
    for (std::string s; std::getline(stages, s, ',');) {
      const size_t b = s.find_first_not_of(" \t"), x = s.find_last_not_of(" \t");
      if (b != std::string::npos && s.substr(b, x - b + 1) == "asm") return true;
    }
    return false;
  }();
  return on;
}

void dump_loop(const uint8_t* code, size_t size, const Spec& spec) {
  if (!dump_asm()) return;
  std::lock_guard<std::mutex> lock(g_mu);
  const int id = g_next++;
  char name[32];
  std::snprintf(name, sizeof name, "loop-%04d", id);
  if (FILE* map = std::fopen(("/tmp/perf-" + std::to_string(getpid()) + ".map").c_str(), "a")) {
    std::fprintf(map, "%lx %zx tessera_loop_%04d\n", static_cast<unsigned long>(reinterpret_cast<uintptr_t>(code)), size, id);
    std::fclose(map);
  }
  size_t loads = 0;
  for (const kir::Instr& I : *spec.prog) loads += I.code == kir::Code::Load;
  char head[200];
  std::snprintf(head, sizeof head, "; tessera %s: %zu instructions, %zu loads, %zu results%s, %zu bytes at %p\n", name,
                spec.prog->size(), loads, spec.results.size(), spec.stream ? " (non-temporal stores)" : "", size,
                static_cast<const void*>(code));
  const char* dir = std::getenv("TESSERA_DUMP_DIR");
  if (dir && *dir) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    const fs::path bin = fs::path(dir) / (std::string(name) + ".bin");
    write_file(bin, code, size);
    const std::string text = head + disassemble(bin, code);
    write_file(fs::path(dir) / (std::string(name) + ".s"), text.data(), text.size());
    return;
  }
  char tmp[] = "/tmp/tessera-loop-XXXXXX";
  const int fd = mkstemp(tmp);
  if (fd < 0) return;
  close(fd);
  write_file(tmp, code, size);
  std::fprintf(stderr, "==== tessera dump: %s, asm ====\n%s%s", name, head, disassemble(tmp, code).c_str());
  std::fflush(stderr);
  fs::remove(tmp);
}

}  // namespace tessera::backends::jit
