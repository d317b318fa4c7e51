/*
 * cuda.h - what the cuda backend offers beyond struct backend_ops:
 * a view of the device's free memory, for tests and tools only.
 */
#ifndef GMB_BACKEND_CUDA_H
#define GMB_BACKEND_CUDA_H

#include <stdint.h>

struct backend;

/**
 * backend_cuda_mem_info() - the driver's free and total memory of a device
 * (cuMemGetInfo), i.e. what every process on the GPU leaves free.
 * @b:           a backend opened as "cuda" (any other is -EINVAL)
 * @dev:         device index of @b
 * @free_bytes:  receives the free bytes
 * @total_bytes: receives the total bytes
 *
 * cuMemGetInfo needs a context, so this retains the device's primary context
 * until backend_close(): about 500 MiB of GPU memory unless the process holds
 * it already. Only tests and tools should call it, never gmbd, which runs
 * with cuInit's 4 MiB and no context.
 *
 * Return: 0, or a negative errno with backend_last_error() saying why.
 */
int backend_cuda_mem_info(struct backend *b, int dev, uint64_t *free_bytes, uint64_t *total_bytes);

#endif
