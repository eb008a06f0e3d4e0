// os_log messages of kernels (MSL 3.2's <metal_logging>): formatted here, kept
// per dispatch, written to stderr once the dispatch has run.
#pragma once

#include <string>

#include "mtlsim/abi.h"

namespace mtlsim {

// The message's format with its arguments, as printf would write them (the
// arguments converted to what each conversion reads); a conversion without an
// argument stays as written.
std::string format_log(const LogMessage& message);

// "debug", "info", ...: the level's name.
const char* log_level_name(LogType type);

}  // namespace mtlsim
