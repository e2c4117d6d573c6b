#include <algorithm>
#include <set>

#include "core/fail.h"
#include "tessera/nn.h"

namespace tessera::nn {

namespace {
thread_local std::vector<const Module*> t_modules;  // modules whose scope is pushed, innermost last
}

ModuleScope::ModuleScope(const Module& m) {
  if (!t_modules.empty() && t_modules.back() == &m) return;
  scope_.emplace(m.scope_name().empty() ? m.type_name() : m.scope_name());
  t_modules.push_back(&m);
}

ModuleScope::~ModuleScope() {
  if (scope_) t_modules.pop_back();
}

Tensor Module::operator()(const Tensor& x) {
  ModuleScope s(*this);
  return forward(x);
}

Tensor Module::forward(const Tensor&) { fail(type_name_, "this module has no single-input forward()"); }

Tensor Module::register_parameter(const std::string& name, Tensor t) {
  if (t.defined()) t.requires_grad_();
  params_.push_back({name, t});
  return t;
}

Tensor Module::register_buffer(const std::string& name, Tensor t) {
  buffers_.push_back({name, t});
  return t;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> m) {
  if (!m) fail(type_name_, "register_module('" + name + "') got a null module");
  m->set_scope_name(name);
  children_.push_back({name, std::move(m)});
}

void Module::collect(const std::string& prefix, std::vector<std::pair<std::string, Tensor>>& out, bool params,
                     std::vector<Tensor>& seen) const {
  for (auto& [name, t] : params ? params_ : buffers_) {
    const Tensor& tensor = t;  // a lambda cannot capture a structured binding in clang 14
    if (!t.defined() || std::any_of(seen.begin(), seen.end(), [&](const Tensor& s) { return s.is_same(tensor); })) continue;
    seen.push_back(t);
    out.push_back({prefix + name, t});
  }
  for (auto& [name, child] : children_) child->collect(prefix + name + ".", out, params, seen);
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> r;
  std::vector<Tensor> seen;
  collect("", r, true, seen);
  return r;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> r;
  for (auto& [n, t] : named_parameters()) r.push_back(t);
  return r;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers() const {
  std::vector<std::pair<std::string, Tensor>> r;
  std::vector<Tensor> seen;
  collect("", r, false, seen);
  return r;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_modules() const {
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> r;
  for (auto& [name, child] : children_) {
    r.push_back({name, child});
    for (auto& [sub, m] : child->named_modules()) r.push_back({name + "." + sub, m});
  }
  return r;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (auto& [name, t] : named_parameters()) n += t.numel();
  return n;
}

std::map<std::string, Tensor> Module::state_dict() const {
  std::map<std::string, Tensor> r;
  for (auto& [n, t] : named_parameters()) r[n] = t;
  for (auto& [n, t] : named_buffers()) r[n] = t;
  return r;
}

void Module::load_state_dict(const std::map<std::string, Tensor>& sd, bool strict) {
  auto mine = state_dict();
  std::string missing, unexpected;
  for (auto& [n, t] : mine)
    if (!sd.count(n)) missing += (missing.empty() ? "" : ", ") + n;
  for (auto& [n, t] : sd)
    if (!mine.count(n)) unexpected += (unexpected.empty() ? "" : ", ") + n;
  if (strict && (!missing.empty() || !unexpected.empty()))
    fail("load_state_dict", "state does not match the " + type_name_ + (missing.empty() ? "" : "; missing: " + missing) +
                                (unexpected.empty() ? "" : "; unexpected: " + unexpected), "");
  NoGradGuard g;
  for (auto& [n, t] : mine) {
    auto it = sd.find(n);
    if (it == sd.end()) continue;
    const Tensor& src = it->second;
    if (src.shape() != t.shape() || src.dtype() != t.dtype())
      fail("load_state_dict", "'" + n + "' is " + dtype_name(t.dtype()) + shape_str(t.shape()) + " in the model but " +
                                  dtype_name(src.dtype()) + shape_str(src.shape()) + " in the state", "");
    Tensor target = t;
    target.copy_(src.device() == t.device() ? src : src.to(t.device()));
  }
  sync();
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, c] : children_) c->train(on);
}

void Module::to(const Device& d) {
  std::vector<Tensor> all;
  for (auto& [n, t] : named_parameters()) all.push_back(t);
  for (auto& [n, t] : named_buffers()) all.push_back(t);
  for (Tensor& t : all) {
    if (t.device() == d) continue;
    t.set_data(t.detach().to(d));
  }
}

// ---- containers ----
Sequential& Sequential::add(std::shared_ptr<Module> m) {
  add_child(std::to_string(size()), std::move(m));
  return *this;
}
size_t Sequential::size() const { return children_.size(); }
Tensor Sequential::forward(const Tensor& x) {
  Tensor y = x;
  for (auto& [name, m] : children_) y = (*m)(y);
  return y;
}

ModuleList& ModuleList::add(std::shared_ptr<Module> m) {
  std::string idx = std::to_string(size());
  add_child(idx, std::move(m));
  children_.back().second->set_scope_name(scope_name().empty() ? idx : scope_name() + "." + idx);
  return *this;
}
size_t ModuleList::size() const { return children_.size(); }
std::shared_ptr<Module> ModuleList::operator[](size_t i) const {
  if (i >= children_.size()) fail("ModuleList", "index " + std::to_string(i) + " out of range for " + std::to_string(children_.size()) + " modules");
  return children_[i].second;
}
void ModuleList::set_scope_name(const std::string& s) {
  Module::set_scope_name(s);
  for (size_t i = 0; i < children_.size(); ++i) children_[i].second->set_scope_name(s + "." + std::to_string(i));
}

}  // namespace tessera::nn
