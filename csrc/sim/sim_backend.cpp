// The simulator as a backend: CPU tensors, the kernel modules compiled into
// this extension, streams from sim_streams.
#include "sim/sim_backend.h"

#include <atomic>
#include <mutex>
#include <unordered_map>

#include "gpu_fill.h"
#include "sim/builtin_modules.h"
#include "sim/runtime/fork.h"
#include "sim/sim_streams.h"

namespace mps_ext {

mtlsim::Buffer sim_buffer(const at::Tensor& t) {
  static char empty;
  if (t.numel() == 0) return mtlsim::Buffer::bytes(&empty, 0);
  const size_t element = t.element_size();
  mtlsim::Buffer b{t.data_ptr(), element, element, {}};
  for (int64_t d = 0; d < t.dim(); ++d) {
    b.size += size_t((t.size(d) - 1) * t.stride(d)) * element;
    b.dims.push_back(mtlsim::Extent{size_t(t.size(d)), size_t(t.stride(d)) * element});
  }
  return b;
}

namespace {

class SimBackend final : public Backend {
 public:
  const char* name() const override { return "simulator"; }

  std::optional<std::string> unavailable(const std::string& kernel, uint32_t threads) override {
    const mtlsim::Module* module = nullptr;
    const mtlsim::KernelInfo* info = builtin_kernel(kernel, &module);
    if (!info) return "no kernel named '" + kernel + "' in this build";
    const uint32_t limit = info->max_total_threads_per_threadgroup ? info->max_total_threads_per_threadgroup
                                                                    : mtlsim::kMaxThreadsPerThreadgroup;
    if (threads > limit) return "kernel '" + kernel + "' allows " + std::to_string(limit) + " threads per threadgroup";
    return std::nullopt;
  }

  int64_t fill_simdgroups(const std::string&, uint32_t) override { return fill_simdgroups_for_cores(sim_gpu_cores()); }

  void dispatch(const Launch& launch) override {
    const mtlsim::Module* module = nullptr;
    const mtlsim::KernelInfo* kernel = builtin_kernel(launch.kernel, &module);
    TORCH_CHECK(kernel, "mps_ext: no kernel named '", launch.kernel, "' in this build");
    TORCH_CHECK(launch.args.size() <= mtlsim::kMaxBufferSlots, "too many kernel arguments");
    // The copy of the launch keeps its tensors alive until the kernel has run;
    // checked mode is what it is now, when the kernel is enqueued.
    sim_streams::submit([launch, module, kernel, options = mtlsim::default_options()] {
      run(launch, module, kernel, options);
      return std::vector<std::string>{};
    });
  }

  int64_t new_stream() override { return sim_streams::new_stream(); }
  int64_t current_stream() override { return sim_streams::current(); }
  void set_current_stream(int64_t stream) override { sim_streams::set_current(stream); }
  void synchronize(int64_t stream) override { sim_streams::synchronize(stream); }
  bool query(int64_t stream) override { return sim_streams::query(stream); }
  std::unique_ptr<Event> new_event() override { return sim_streams::new_event(); }
  void record_tensor(const at::Tensor& t, int64_t stream) override { sim_streams::keep_alive(stream, t.storage()); }
  void before_torch_ops() override { sim_streams::synchronize(sim_streams::current()); }

 private:
  static void run(const Launch& launch, const mtlsim::Module* module, const mtlsim::KernelInfo* kernel,
                  const mtlsim::Options& options) {
    mtlsim::Launch l;
    l.module = module;
    l.kernel = kernel;
    for (size_t i = 0; i < launch.args.size(); ++i) {
      const Arg& a = launch.args[i];
      if (a.is_tensor()) {
        l.buffers[i] = sim_buffer(a.tensor);
      } else {
        l.buffers[i] = mtlsim::Buffer::bytes(const_cast<uint8_t*>(a.bytes.data()), a.bytes.size());
      }
    }
    l.grid_in_threads = false;
    l.grid = mtlsim::Dim3{launch.threadgroups.x, launch.threadgroups.y, launch.threadgroups.z};
    const Size3 t = launch.threads_per_threadgroup;
    l.threadgroup = mtlsim::Dim3{t.x, t.y, t.z};
    mtlsim::Report report;
    try {
      report = mtlsim::dispatch(l, options);
    } catch (const mtlsim::SimError& e) {
      TORCH_CHECK(false, "mps_ext simulator: ", e.what());
    }
    // The package's own kernels must never depend on divergent control flow.
    TORCH_CHECK(report.warnings.empty(), "mps_ext simulator: ", report.warnings.front());
  }
};

}  // namespace

const mtlsim::KernelInfo* builtin_kernel(const std::string& name, const mtlsim::Module** module) {
  static std::mutex& mu = [] () -> std::mutex& {
    static std::mutex m;
    mtlsim::fork_protect(m, mtlsim::ForkRank::Backend);
    return m;
  }();
  static std::unordered_map<std::string, std::pair<const mtlsim::Module*, const mtlsim::KernelInfo*>> index;
  std::lock_guard<std::mutex> lock(mu);
  if (index.empty()) {
    for (const mtlsim::BuiltinModule& m : mtlsim::builtin_modules()) {
      const mtlsim::Module& mod = mtlsim::builtin_module(m.name, m.init);
      for (uint32_t k = 0; k < mod.info->num_kernels; ++k)
        index[mod.info->kernels[k].host_name] = {&mod, &mod.info->kernels[k]};
    }
  }
  auto it = index.find(name);
  if (it == index.end()) return nullptr;
  *module = it->second.first;
  return it->second.second;
}

namespace {
std::atomic<int64_t> simulated_cores{kSimulatedGpuCores};
}  // namespace

int64_t sim_gpu_cores() { return simulated_cores.load(); }

void set_sim_gpu_cores(int64_t cores) {
  TORCH_CHECK_VALUE(cores > 0, "mps_ext.sim.gpu_cores: cores must be positive, got ", cores);
  simulated_cores.store(cores);
}

Backend& sim_backend() {
  static SimBackend backend;
  return backend;
}

}  // namespace mps_ext
