#include <dlfcn.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include "api.h"
#include "fork.h"
#include "runtime.h"

namespace mtlsim {

namespace {

std::mutex modules_mu;
const bool fork_safe = (fork_protect(modules_mu, ForkRank::Modules), true);

std::map<std::string, std::unique_ptr<Module>>& modules() {
  static std::map<std::string, std::unique_ptr<Module>> m;
  return m;
}

const Module& add(const std::string& name, ModuleInitFn init) {
  const ModuleInfo* info = init(&runtime_api());
  if (!info || info->abi_version != kAbiVersion)
    throw SimError("kernel module " + name + " was built for another simulator ABI; rebuild it");
  auto& slot = modules()[name];
  slot = std::make_unique<Module>(Module{name, info});
  return *slot;
}

}  // namespace

const KernelInfo* Module::find(const std::string& host_name) const {
  for (uint32_t i = 0; i < info->num_kernels; ++i)
    if (host_name == info->kernels[i].host_name) return &info->kernels[i];
  return nullptr;
}

const Module& builtin_module(const std::string& name, ModuleInitFn init) {
  std::lock_guard<std::mutex> lock(modules_mu);
  auto it = modules().find(name);
  return it != modules().end() ? *it->second : add(name, init);
}

const Module& load_module(const std::string& path) {
  std::lock_guard<std::mutex> lock(modules_mu);
  auto it = modules().find(path);
  if (it != modules().end()) return *it->second;
  // Never unloaded: kernels' code and strings must outlive every report.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) throw SimError("cannot load kernel module " + path + ": " + dlerror());
  auto init = reinterpret_cast<ModuleInitFn>(dlsym(handle, "mtlsim_module_init"));
  if (!init) throw SimError(path + " is not a simulator kernel module (no mtlsim_module_init)");
  return add(path, init);
}

}  // namespace mtlsim
