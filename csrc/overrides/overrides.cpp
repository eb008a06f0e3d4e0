#include "overrides/overrides.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/function.h>  // get_current_node (torch 2.11 declares it here, later ones in node.h)

#include <memory>
#include <mutex>

#include "sim/runtime/fork.h"

namespace mps_ext::overrides {

namespace {

std::mutex mu;
std::map<c10::DeviceType, std::unique_ptr<OverrideLibrary>> libraries;
std::map<std::string, OpStats> op_stats;
const bool fork_safe = (mtlsim::fork_protect(mu, mtlsim::ForkRank::Overrides), true);
thread_local int calling_torch = 0;

// The counters of this call, or nullptr when an outer call counts it.
OpStats* counters(const char* op) {
  if (calling_torch) return nullptr;
  // The autograd engine names the node it runs: a backward's mm is not the user's mm.
  return &op_stats[torch::autograd::get_current_node() ? std::string(op) + " (backward)" : std::string(op)];
}

c10::DispatchKey key_for(c10::DeviceType device) {
  TORCH_CHECK_VALUE(device == c10::DeviceType::MPS || device == c10::DeviceType::CPU,
                    "mps_ext overrides exist for the mps and cpu devices, not ", device);
  return device == c10::DeviceType::MPS ? c10::DispatchKey::MPS : c10::DispatchKey::CPU;
}

// Replacing torch's kernels is what enabling the overrides means: torch's
// warning about it (once per process) would only alarm users. Other warnings
// pass on to the handler in place.
class DropOverrideWarning final : public c10::WarningHandler {
 public:
  void process(const c10::Warning& warning) override {
    if (warning.msg().find("Overriding a previously registered kernel") == std::string::npos) previous_->process(warning);
  }

 private:
  c10::WarningHandler* previous_ = c10::WarningUtils::get_warning_handler();
};

at::Tensor resolved(const at::Tensor& t) { return t.resolve_conj().resolve_neg(); }

void resolve_lazy_bits(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const size_t n = op.schema().arguments().size();
  for (size_t i = stack->size() - n; i < stack->size(); ++i) {
    c10::IValue& arg = (*stack)[i];
    if (arg.isTensor()) {
      arg = resolved(arg.toTensor());
    } else if (arg.isTensorList()) {
      c10::List<at::Tensor> list;  // a new list: the caller's stays as it was
      for (const at::Tensor& t : arg.toTensorList()) list.push_back(resolved(t));
      arg = std::move(list);
    }
  }
  // Past both bits' keys (Negative comes first): nothing is left for them.
  op.redispatchBoxed(keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::Conjugate), stack);
}

}  // namespace

OverrideLibrary::OverrideLibrary(c10::DispatchKey key)
    : device_(torch::Library::IMPL, "aten", key, __FILE__, __LINE__),
      conjugate_(torch::Library::IMPL, "aten", c10::DispatchKey::Conjugate, __FILE__, __LINE__),
      negative_(torch::Library::IMPL, "aten", c10::DispatchKey::Negative, __FILE__, __LINE__),
      autograd_(torch::Library::IMPL, "aten", c10::getAutogradKeyFromBackend(c10::toBackendComponent(key)), __FILE__,
                __LINE__) {}

torch::CppFunction OverrideLibrary::resolving_lazy_bits() {
  return torch::CppFunction::makeFromBoxedFunction<&resolve_lazy_bits>();
}

void enable(c10::DeviceType device) {
  const c10::DispatchKey key = key_for(device);
  std::lock_guard<std::mutex> lock(mu);
  if (libraries.count(device)) return;
  DropOverrideWarning quiet;
  c10::WarningUtils::WarningHandlerGuard guard(&quiet);
  auto lib = std::make_unique<OverrideLibrary>(key);
  register_softmax(*lib);
  register_linear(*lib, device);
  register_linalg(*lib);
  register_fp8(*lib, device);
  register_grouped_mm(*lib);
  register_pad(*lib);
  register_upsample(*lib);
  register_dropout(*lib);
  register_attention(*lib, device);
  libraries[device] = std::move(lib);
}

void disable(c10::DeviceType device) {
  key_for(device);
  std::lock_guard<std::mutex> lock(mu);
  libraries.erase(device);  // deregisters: torch's own kernels are back
}

bool is_enabled(c10::DeviceType device) {
  key_for(device);
  std::lock_guard<std::mutex> lock(mu);
  return libraries.count(device) != 0;
}

std::vector<std::string> overridden_ops(c10::DeviceType device) {
  key_for(device);
  std::lock_guard<std::mutex> lock(mu);
  auto it = libraries.find(device);
  return it == libraries.end() ? std::vector<std::string>{} : it->second->ops();
}

void hit(const char* op) {
  std::lock_guard<std::mutex> lock(mu);
  if (OpStats* s = counters(op)) ++s->hits;
}

CallingTorch fallback(const char* op, const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu);
  if (OpStats* s = counters(op)) {
    ++s->fallbacks;
    ++s->reasons[reason];
  }
  return {};
}

bool inside_torch_call() { return calling_torch > 0; }

CallingTorch::CallingTorch() { ++calling_torch; }
CallingTorch::~CallingTorch() { --calling_torch; }

std::map<std::string, OpStats> stats() {
  std::lock_guard<std::mutex> lock(mu);
  return op_stats;
}

void reset_stats() {
  std::lock_guard<std::mutex> lock(mu);
  op_stats.clear();
}

}  // namespace mps_ext::overrides
