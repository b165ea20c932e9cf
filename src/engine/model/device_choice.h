// The one rule for which device a model runs on, shared by every model kind's loader (LoadDecoder,
// LoadBertOnDevice, LoadCnnOnDevice, NewSyntheticRunner), given the kind's backend from the Backends value
// (backends.h).
#pragma once

#include <string>
#include <string_view>

#include "base/status.h"

namespace stoke {

// Where a model of one device backend runs, written once for every kind (decoder, encoder, CNN, synthetic):
// `device` "cpu" -> "cpu"; "auto" -> "cuda" when the backend is compiled in (`compiled`) and `available`
// (null: always) says a GPU is visible, else "cpu"; "cuda" -> "cuda", or FailedPrecondition saying why not:
// "{context} this stoke was built without CUDA (...)" / "{context} no CUDA GPU is visible (...); use
// {cpu_hint}". Anything else: InvalidArgument.
//   ResolveBackendDevice(o.device, b.create != nullptr, b.available, "--device cuda:", "--device cpu")
StatusOr<std::string> ResolveBackendDevice(const std::string& device, bool compiled, bool (*available)(),
                                           std::string_view context, std::string_view cpu_hint);

}  // namespace stoke
