// The library torch's pluggable allocator loads (torch.cuda.memory.CUDAPluggableAllocator): it takes a shared
// library and the names of its allocate and free functions. Here those functions call back into Python, into
// uvm_lab.allocators.torch, which sets the callbacks at load time; ctypes' callbacks take the GIL themselves.
//
// Two allocate functions, for torch's two ways of calling them:
// - uvm_lab_torch_malloc, for change_current_allocator: torch does not check the pointer it gets back, so a
//   failure is thrown as a C++ exception, which torch turns into a Python RuntimeError carrying its message.
// - uvm_lab_torch_pool_malloc, for a torch.cuda.MemPool: torch's caching allocator takes a null pointer for
//   "out of memory" (it frees what it caches, retries, then raises torch.OutOfMemoryError), and an exception
//   thrown through it would leave its own books half written.

#include <cstddef>
#include <cstring>
#include <stdexcept>
#include <string>
#include <sys/types.h>

extern "C" {

// pooled: whether torch's caching allocator asks, for a MemPool's segment.
typedef void *(*uvm_lab_alloc_hook)(ssize_t size, int device, void *stream, int pooled, char *error,
                                    size_t error_size);
typedef void (*uvm_lab_free_hook)(void *ptr, ssize_t size, int device, void *stream);

static uvm_lab_alloc_hook alloc_hook = nullptr;
static uvm_lab_free_hook free_hook = nullptr;

void uvm_lab_torch_set_hooks(uvm_lab_alloc_hook alloc, uvm_lab_free_hook release) {
    alloc_hook = alloc;
    free_hook = release;
}

static void *allocate(ssize_t size, int device, void *stream, int pooled, char *error, size_t error_size) {
    if (alloc_hook == nullptr) {
        std::strncpy(error, "uvm_lab's torch allocator has no hooks: import uvm_lab.allocators.torch", error_size);
        return nullptr;
    }
    return alloc_hook(size, device, stream, pooled, error, error_size);
}

void *uvm_lab_torch_pool_malloc(ssize_t size, int device, void *stream) {
    char error[512] = {0};
    return allocate(size, device, stream, 1, error, sizeof error);
}

void *uvm_lab_torch_malloc(ssize_t size, int device, void *stream) {
    char error[512] = {0};
    void *ptr = allocate(size, device, stream, 0, error, sizeof error);
    if (ptr == nullptr && size > 0) {
        error[sizeof error - 1] = '\0';
        throw std::runtime_error(error[0] ? std::string(error) : std::string("uvm_lab: allocation failed"));
    }
    return ptr;
}

void uvm_lab_torch_free(void *ptr, ssize_t size, int device, void *stream) {
    if (free_hook != nullptr) {
        free_hook(ptr, size, device, stream);
    }
}

}  // extern "C"
