// Registers the CUDA model backends with the CPU-only factories (engine/model/factory.h,
// engine/model/bert_backend.h). apps/stoke calls it at startup in CUDA builds.
#pragma once

namespace stoke {
void RegisterCudaBackends();
}  // namespace stoke
