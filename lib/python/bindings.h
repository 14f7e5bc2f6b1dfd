// The Python module's units, one per area. module.cpp calls them in this order: a class is
// registered before the functions whose signatures name it (Context, then KvCache), so that
// their docstrings show the Python name.
#pragma once

#include <pybind11/pybind11.h>

namespace cpuattn_py {

// dlpack.cpp (dlpack.h): DLPack tensors in, torch tensors out; no bindings of its own.
// context.cpp: Context, release_thread_contexts, active_target, kv_dtypes, supported_targets,
// active_simd, to_bf16, from_bf16.
void bind_context(pybind11::module_& m);
// attention.cpp: attention, reference_attention, attention_varlen, reference_attention_varlen.
void bind_attention(pybind11::module_& m);
// caches.cpp: KvCache.
void bind_kv_cache(pybind11::module_& m);
// layers.cpp: MultiHeadAttention.
void bind_layers(pybind11::module_& m);
// paged.cpp: PagedKvCache, attention_paged, reference_attention_paged.
void bind_paged(pybind11::module_& m);

}  // namespace cpuattn_py
