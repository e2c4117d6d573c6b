// memory_viewer_html: a MemoryPlan as one self-contained page: an SVG plot of the buffers over
// program order (parameters and outputs stacked for the whole run, temporaries at their arena
// offsets over their lifetimes), the live-bytes line and the peak; a legend of the largest
// temporaries at the peak; the plan's report; and a small script showing a buffer's details on
// hover (its data inline as JSON).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include <nlohmann/json.hpp>

#include "profiler/export.h"

namespace tessera {
namespace {

std::string html_escape(const std::string& s) {
  std::string r;
  for (char c : s) {
    if (c == '<') r += "&lt;";
    else if (c == '>') r += "&gt;";
    else if (c == '&') r += "&amp;";
    else if (c == '"') r += "&quot;";
    else r += c;
  }
  return r;
}

std::string human(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.1f %s" : "%.0f %s", b, units[u]);
  return buf;
}

// A round step for about `want` ticks over `range`: 1, 2 or 5 times a power of ten.
double nice(double range, int want) {
  double raw = range / want, p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * p >= raw) return m * p;
  return 10 * p;
}

// A buffer's colour: grey parameters, blue outputs, temporaries by module and op (plot and legend).
std::string colour(const PlannedBuffer& b) {
  if (b.kind == "param") return "#b0b0b0";
  if (b.kind == "output") return "#8fb3d9";
  unsigned h = 0;
  for (char c : b.scope + b.op) h = h * 31 + (unsigned char)c;
  return "hsl(" + std::to_string(h % 360) + ",60%,62%)";
}

// Where each buffer goes: x over Steps [x0, x1), y from y0 in bytes; params then outputs stacked
// from 0 to `base` for the whole run, temporaries above them at their arena offsets.
struct Layout {
  int n = 1;  // Steps (at least 1)
  std::vector<double> y0, x0, x1;
  double base = 0;          // params + outputs
  double top = 0;           // the bytes axis' extent
  std::vector<double> live;  // live bytes per Step

  explicit Layout(const MemoryPlan& plan) : n(std::max(plan.num_steps, 1)) {
    const auto& B = plan.buffers;
    y0.assign(B.size(), 0), x0.assign(B.size(), 0), x1.assign(B.size(), 0);
    for (const char* kind : {"param", "output"})
      for (size_t i = 0; i < B.size(); ++i)
        if (B[i].kind == kind) {
          y0[i] = base, x0[i] = 0, x1[i] = n;
          base += double(B[i].bytes);
        }
    top = base;
    for (size_t i = 0; i < B.size(); ++i)
      if (B[i].kind == "temp") {
        y0[i] = base + double(B[i].offset);
        x0[i] = std::max(B[i].first_step, 0);
        x1[i] = std::max(B[i].last_step, B[i].first_step) + 1;
        top = std::max(top, y0[i] + double(B[i].bytes));
      }
    live.assign(size_t(n), base);
    for (auto& b : B)
      if (b.kind == "temp")
        for (int s = std::max(b.first_step, 0); s <= b.last_step && s < n; ++s) live[size_t(s)] += double(b.bytes);
    top = std::max({top, double(plan.peak_bytes), 1.0}) * 1.05;
  }
};

// The SVG plot: axes, a rect per buffer, the live-bytes line and the peak.
class Plot {
 public:
  Plot(const MemoryPlan& plan, const Layout& layout) : plan_(plan), lay_(layout) {
    svg_.setf(std::ios::fixed);
    svg_.precision(2);
  }

  std::string svg() {
    svg_ << "<svg id=\"plot\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << L + W + 20 << "\" height=\"" << T + H + 50 << "\">\n";
    svg_ << "<rect x=\"" << L << "\" y=\"" << T << "\" width=\"" << W << "\" height=\"" << H << "\" fill=\"#fafafa\" stroke=\"#999\"/>\n";
    axes();
    buffers();
    live_and_peak();
    svg_ << "</svg>\n";
    return svg_.str();
  }

 private:
  static constexpr double W = 1100, H = 480, L = 80, T = 20;
  const MemoryPlan& plan_;
  const Layout& lay_;
  std::ostringstream svg_;

  double X(double s) const { return L + W * s / lay_.n; }
  double Y(double b) const { return T + H - H * b / lay_.top; }

  // Ticks at round values (of MiB on the bytes axis) with light grid lines.
  void axes() {
    const double MiB = 1048576.0, top = lay_.top, ystep = top >= MiB ? nice(top / MiB, 6) * MiB : nice(top, 6);
    for (double b = 0; b <= top; b += ystep) {
      svg_ << "<line x1=\"" << L << "\" y1=\"" << Y(b) << "\" x2=\"" << L + W << "\" y2=\"" << Y(b) << "\" stroke=\"#e4e4e4\"/>\n";
      svg_ << "<text class=\"ax\" x=\"" << L - 4 << "\" y=\"" << Y(b) + 4 << "\" text-anchor=\"end\">" << human(b) << "</text>\n";
    }
    const double xstep = std::max(1.0, nice(double(lay_.n), 8));
    for (double s = 0; s <= lay_.n; s += xstep)
      svg_ << "<text class=\"ax\" x=\"" << X(s) << "\" y=\"" << T + H + 16 << "\" text-anchor=\"middle\">" << int64_t(s) << "</text>\n";
    svg_ << "<text class=\"ax\" x=\"" << L + W / 2 << "\" y=\"" << T + H + 36 << "\" text-anchor=\"middle\">program order (Step)</text>\n";
  }

  void buffers() {
    svg_ << "<g id=\"buffers\">\n";
    for (size_t i = 0; i < plan_.buffers.size(); ++i) {
      const PlannedBuffer& b = plan_.buffers[i];
      const double y0 = lay_.y0[i], x0 = lay_.x0[i], x1 = lay_.x1[i];
      bool peak = plan_.peak_step >= 0 && (b.kind != "temp" || (b.first_step <= plan_.peak_step && plan_.peak_step <= b.last_step));
      double hgt = std::max(Y(y0) - Y(y0 + double(b.bytes)), 0.0);
      svg_ << "<rect class=\"buf" << (peak && b.kind == "temp" ? " peak" : "") << "\" data-i=\"" << i << "\" x=\"" << X(x0)
           << "\" y=\"" << Y(y0 + double(b.bytes)) << "\" width=\"" << std::max(X(x1) - X(x0), 0.5) << "\" height=\"" << hgt
           << "\" fill=\"" << colour(b) << "\"><title>"
           << html_escape(b.kind + " " + dtype_short(b.dtype) + shape_str(b.shape) + " " + b.op + (b.scope.empty() ? "" : " in " + b.scope))
           << "</title></rect>\n";
    }
    svg_ << "</g>\n";
    if (Y(0) - Y(lay_.base) >= 14)  // name the band of parameters and outputs when there is room
      svg_ << "<text class=\"ax\" x=\"" << L + 6 << "\" y=\"" << Y(lay_.base / 2) + 4 << "\">parameters and outputs, "
           << human(lay_.base) << ", live for the whole run</text>\n";
  }

  void live_and_peak() {
    svg_ << "<polyline id=\"live\" fill=\"none\" stroke=\"#222\" stroke-width=\"1.2\" points=\"";
    for (int s = 0; s < lay_.n; ++s) svg_ << X(s) << "," << Y(lay_.live[size_t(s)]) << " " << X(s + 1) << "," << Y(lay_.live[size_t(s)]) << " ";
    svg_ << "\"/>\n";
    if (plan_.peak_step < 0) return;
    double px = X(plan_.peak_step + 0.5), py = Y(double(plan_.peak_bytes));
    svg_ << "<line id=\"peak\" x1=\"" << px << "\" y1=\"" << T << "\" x2=\"" << px << "\" y2=\"" << T + H
         << "\" stroke=\"#d00\" stroke-dasharray=\"4 3\"/>\n"
         << "<line x1=\"" << L << "\" y1=\"" << py << "\" x2=\"" << L + W << "\" y2=\"" << py << "\" stroke=\"#d00\" stroke-dasharray=\"4 3\"/>\n"
         << "<text x=\"" << std::min(px + 4, L + W - 300) << "\" y=\"" << std::max(py - 4, T + 12.0) << "\" fill=\"#d00\">peak "
         << human(double(plan_.peak_bytes)) << " at step " << plan_.peak_step << "</text>\n";
  }
};

// The largest temporaries live at the peak, each with its colour.
std::string legend_html(const MemoryPlan& plan) {
  std::ostringstream legend;
  legend << "<div id=\"legend\"><b>Largest temporaries at the peak</b>";
  int shown = 0;
  for (const PlannedBuffer& b : plan.live_at_peak) {
    if (b.kind != "temp" || shown == 8) continue;
    legend << "<div><span class=\"sw\" style=\"background:" << colour(b) << "\"></span>" << html_escape(human(double(b.bytes))) << " "
           << dtype_short(b.dtype) << html_escape(shape_str(b.shape)) << " " << html_escape(b.op)
           << (b.scope.empty() ? "" : " in " + html_escape(b.scope)) << "</div>";
    ++shown;
  }
  legend << "</div>\n";
  return legend.str();
}

// The buffers as a JSON array for the page's script; "</" is escaped so the script cannot end early.
std::string buffers_json(const MemoryPlan& plan) {
  nlohmann::ordered_json data = nlohmann::ordered_json::array();
  for (const PlannedBuffer& b : plan.buffers)
    data.push_back({{"kind", b.kind}, {"shape", shape_str(b.shape)}, {"dtype", dtype_name(b.dtype)}, {"bytes", b.bytes},
                    {"op", b.op}, {"scope", b.scope}, {"first", b.first_step}, {"last", b.last_step}, {"offset", b.offset}});
  std::string js = data.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  for (size_t p = 0; (p = js.find("</", p)) != std::string::npos; p += 3) js.replace(p, 2, "<\\/");
  return js;
}

const char* kStyle =
    "body{font:13px sans-serif;margin:16px} .ax{font-size:11px;fill:#444} rect.buf{stroke:#fff;stroke-width:0.3}\n"
    "rect.buf:hover{stroke:#000;stroke-width:1.5} rect.peak{stroke:#600;stroke-width:0.6}\n"
    "#tip{position:fixed;display:none;background:#fff;border:1px solid #888;padding:6px;font:12px monospace;"
    "pointer-events:none;white-space:pre}\npre{background:#f4f4f4;padding:8px}\n"
    "#legend{margin:4px 0 8px 80px;font-size:12px;columns:2;max-width:1100px} #legend b{column-span:all;display:block}\n"
    ".sw{display:inline-block;width:11px;height:11px;margin-right:6px;vertical-align:-1px;border:1px solid #666}\n";

// Shows a buffer's details next to the pointer; records the counts on the body for headless checks.
const char* kScript =
    "const tip = document.getElementById('tip');\n"
    "function human(b){const u=['B','KiB','MiB','GiB'];let i=0;while(b>=1024&&i<3){b/=1024;i++;}return b.toFixed(i?1:0)+' '+u[i];}\n"
    "document.querySelectorAll('rect.buf').forEach(function(r){\n"
    "  const b = buffers[+r.dataset.i];\n"
    "  r.addEventListener('mousemove', function(ev){\n"
    "    tip.textContent = b.kind + ' ' + b.dtype + b.shape + '  ' + human(b.bytes) + '\\nop: ' + b.op + '\\nmodule: ' +\n"
    "      (b.scope || '(top level)') + '\\nsteps: ' + (b.first < 0 ? 'start' : b.first) + ' - ' + b.last +\n"
    "      (b.kind == 'temp' ? '\\narena offset: ' + b.offset : '');\n"
    "    tip.style.display = 'block'; tip.style.left = (ev.clientX + 12) + 'px'; tip.style.top = (ev.clientY + 12) + 'px';\n"
    "  });\n"
    "  r.addEventListener('mouseleave', function(){ tip.style.display = 'none'; });\n"
    "});\n"
    "document.title = document.title + ' (' + buffers.length + ' buffers)';\n"
    "document.body.setAttribute('data-buffers', buffers.length);\n"
    "document.body.setAttribute('data-rects', document.querySelectorAll('rect.buf').length);\n";

}  // namespace

std::string memory_viewer_html(const MemoryPlan& plan, const std::string& title) {
  const Layout layout(plan);
  std::ostringstream os;
  os << "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>" << html_escape(title) << "</title>\n<style>\n"
     << kStyle << "</style>\n"
     // Script errors are recorded on the page, so a headless check can see them.
     << "<script>window.onerror = function(m){ document.documentElement.setAttribute('data-error', String(m)); };</script>\n"
     << "</head><body>\n"
     << "<h3>" << html_escape(title) << "</h3>\n<p>" << plan.buffers.size() << " buffers over " << plan.num_steps
     << " Steps: parameters (grey) and outputs (blue) for the whole run, temporaries at their arena offsets over their "
        "lifetimes (colour by module and op; dark outline: live at the peak). The black line is the live bytes. Hover a "
        "buffer for its shape, dtype, producing op and module.</p>\n"
     << Plot(plan, layout).svg() << "<div id=\"tip\"></div>\n"
     << legend_html(plan) << "<pre id=\"report\">" << html_escape(plan.report(10)) << "</pre>\n"
     << "<script>\nconst buffers = " << buffers_json(plan) << ";\n" << kScript << "</script>\n</body></html>\n";
  return os.str();
}

void write_memory_viewer(const std::string& path, const MemoryPlan& plan, const std::string& title) {
  profiler::write_file(path, memory_viewer_html(plan, title), "memory viewer");
}

}  // namespace tessera
