/*
 * cuda_contents.c - the cuda backend's operations on contents:
 * draining a device, zeroing, copies to and from host memory (queued on one
 * stream per device, in pieces, waited for once), and pinned host memory.
 * They run in the device's primary context, retained on first use (about
 * 500 MiB of GPU memory unless the application already has it) and pushed
 * on the calling thread only for the call, so an application thread keeps
 * its own current context and the library's threads keep none.
 */
#include "common/backend/libcuda.h"

/* The device's primary context, retained once (~500 MiB unless the app has it). */
static int cuda_dev_ctx(struct cuda_priv *c, int dev, CUcontext *ctx)
{
	struct cuda_dev *d = &c->devs[dev];
	CUresult r = CUDA_SUCCESS;
	CUcontext got = NULL;

	if (!d->visible)
		return cuda__check_dev(c, "context", dev);
	pthread_mutex_lock(&c->lock);
	if (!d->ctx) {
		r = c->api.DevicePrimaryCtxRetain(&got, d->cu);
		if (r == CUDA_SUCCESS)
			d->ctx = got;
	}
	*ctx = d->ctx;
	pthread_mutex_unlock(&c->lock);
	if (r != CUDA_SUCCESS)
		return cuda__fail(c, r, "cuDevicePrimaryCtxRetain", "dev=%d", dev);
	return 0;
}

/*
 * Makes @ctx current on this thread for one operation. Push/pop rather than
 * cuCtxSetCurrent: an application thread keeps its own current context
 * (and with it the runtime's current device), a worker thread goes back to
 * none. @pushed says whether cuda_ctx_pop must undo it.
 */
static int cuda_ctx_push(struct cuda_priv *c, CUcontext ctx, bool *pushed)
{
	CUcontext cur = NULL;
	CUresult r;

	*pushed = false;
	r = c->api.CtxGetCurrent(&cur);
	if (r == CUDA_SUCCESS && cur == ctx)
		return 0;
	if (r == CUDA_SUCCESS)
		r = c->api.CtxPushCurrent(ctx);
	if (r != CUDA_SUCCESS)
		return cuda__fail(c, r, "cuCtxPushCurrent", "ctx=%p", (void *)ctx);
	*pushed = true;
	return 0;
}

static void cuda_ctx_pop(struct cuda_priv *c, bool pushed)
{
	CUcontext ctx;

	if (pushed)
		c->api.CtxPopCurrent(&ctx);
}

static int cuda_dev_enter(struct cuda_priv *c, int dev, bool *pushed)
{
	CUcontext ctx;
	int rc = cuda_dev_ctx(c, dev, &ctx);

	if (rc == 0)
		rc = cuda_ctx_push(c, ctx, pushed);
	return rc;
}

/* This backend's stream on @dev; its context must be current. */
static int cuda_dev_stream(struct cuda_priv *c, int dev, CUstream *s)
{
	struct cuda_dev *d = &c->devs[dev];
	CUresult r = CUDA_SUCCESS;
	CUstream got = NULL;

	pthread_mutex_lock(&c->lock);
	/* Non-blocking: no implicit ordering with the application's stream 0. */
	if (!d->stream) {
		r = CUDA_RELAXED(c, c->api.StreamCreate(&got, CU_STREAM_NON_BLOCKING));
		if (r == CUDA_SUCCESS)
			d->stream = got;
	}
	*s = d->stream;
	pthread_mutex_unlock(&c->lock);
	if (r != CUDA_SUCCESS)
		return cuda__fail(c, r, "cuStreamCreate", "dev=%d", dev);
	return 0;
}

/* Contents. */

int cuda__sync(struct backend *b, int dev)
{
	struct cuda_priv *c = b->priv;
	bool pushed;
	CUresult r;
	int rc;

	rc = cuda__check_dev(c, "sync", dev);
	if (rc == 0)
		rc = cuda_dev_enter(c, dev, &pushed);
	if (rc < 0)
		return rc;
	/*
	 * Drains every stream of the primary context: the application's too.
	 * Relaxed, as every call here: a drain in the default global mode, while
	 * the application captures a graph, would invalidate its capture.
	 */
	r = CUDA_RELAXED(c, c->api.CtxSynchronize());
	cuda_ctx_pop(c, pushed);
	if (r != CUDA_SUCCESS)
		return cuda__fail(c, r, "cuCtxSynchronize", "dev=%d", dev);
	return 0;
}

static const char *const cuda_op_call[] = {
	[BACKEND_TO_HOST] = "cuMemcpyDtoHAsync",
	[BACKEND_FROM_HOST] = "cuMemcpyHtoDAsync",
	[BACKEND_ZERO] = "cuMemsetD8Async",
};

static CUresult cuda_enqueue(struct cuda_priv *c, enum backend_contents op, CUstream s, char *host,
			     CUdeviceptr va, size_t n)
{
	switch (op) {
	case BACKEND_TO_HOST:
		return c->api.MemcpyDtoHAsync(host, va, n, s);
	case BACKEND_FROM_HOST:
		return c->api.MemcpyHtoDAsync(va, host, n, s);
	case BACKEND_ZERO:
		return c->api.MemsetD8Async(va, 0, n, s);
	}
	return CUDA_ERROR_INVALID_VALUE;
}

/*
 * Enqueues @op over [va, va+size) in pieces on @dev's stream; waits once
 * when @wait is set, or when enqueueing failed.
 */
static int cuda_contents_run(struct cuda_priv *c, int dev, enum backend_contents op, char *host,
			     uintptr_t va, uint64_t size, bool wait)
{
	CUresult r = CUDA_SUCCESS, rs;
	uint64_t off = 0, n = 0;
	CUstream s;
	int rc;

	rc = cuda_dev_stream(c, dev, &s);
	if (rc < 0)
		return rc;
	for (; off < size && r == CUDA_SUCCESS; off += n) {
		n = size - off < CUDA_COPY_PIECE ? size - off : CUDA_COPY_PIECE;
		r = CUDA_RELAXED(c, cuda_enqueue(c, op, s, host ? host + off : NULL, va + off, n));
	}
	/* On failure wait too: pieces already queued still read or write @host. */
	rs = wait || r != CUDA_SUCCESS ? CUDA_RELAXED(c, c->api.StreamSynchronize(s)) :
					 CUDA_SUCCESS;
	if (r != CUDA_SUCCESS)
		return cuda__fail(c, r, cuda_op_call[op],
				  "dev=%d va=0x%" PRIxPTR " size=0x%" PRIx64 " at=0x%" PRIx64, dev,
				  va, size, off - n);
	if (rs != CUDA_SUCCESS)
		return cuda__fail(c, rs, "cuStreamSynchronize",
				  "after %s dev=%d va=0x%" PRIxPTR " size=0x%" PRIx64,
				  cuda_op_call[op], dev, va, size);
	return 0;
}

static int cuda_contents(struct backend *b, int dev, enum backend_contents op, char *host,
			 uintptr_t va, uint64_t size, bool wait)
{
	struct cuda_priv *c = b->priv;
	bool pushed;
	int rc;

	rc = cuda__check_dev(c, cuda_op_call[op], dev);
	if (rc < 0 || size == 0)
		return rc;
	if (op != BACKEND_ZERO && !host)
		return backend_fail(-EINVAL, "cuda backend: %s: no host buffer", cuda_op_call[op]);
	rc = cuda_dev_enter(c, dev, &pushed);
	if (rc < 0)
		return rc;
	rc = cuda_contents_run(c, dev, op, host, va, size, wait);
	cuda_ctx_pop(c, pushed);
	return rc;
}

int cuda__zero(struct backend *b, int dev, uintptr_t va, uint64_t size)
{
	return cuda_contents(b, dev, BACKEND_ZERO, NULL, va, size, true);
}

int cuda__copy_to_host(struct backend *b, int dev, void *dst, uintptr_t src, uint64_t size)
{
	return cuda_contents(b, dev, BACKEND_TO_HOST, dst, src, size, true);
}

int cuda__copy_from_host(struct backend *b, int dev, uintptr_t dst, const void *src, uint64_t size)
{
	/* The driver only reads @src (cuMemcpyHtoDAsync takes a const pointer). */
	return cuda_contents(b, dev, BACKEND_FROM_HOST, (char *)(uintptr_t)src, dst, size, true);
}

int cuda__contents_queue(struct backend *b, int dev, enum backend_contents op, void *host,
			 uintptr_t va, uint64_t size)
{
	return cuda_contents(b, dev, op, host, va, size, false);
}

/* Waits for what contents_queue put on @dev's stream. */
int cuda__wait(struct backend *b, int dev)
{
	struct cuda_priv *c = b->priv;
	CUstream s;
	bool pushed;
	CUresult r;
	int rc;

	rc = cuda__check_dev(c, "wait", dev);
	if (rc < 0)
		return rc;
	rc = cuda_dev_enter(c, dev, &pushed);
	if (rc < 0)
		return rc;
	rc = cuda_dev_stream(c, dev, &s);
	if (rc == 0) {
		r = CUDA_RELAXED(c, c->api.StreamSynchronize(s));
		if (r != CUDA_SUCCESS)
			rc = cuda__fail(c, r, "cuStreamSynchronize", "dev=%d", dev);
	}
	cuda_ctx_pop(c, pushed);
	return rc;
}

/*
 * Host memory needs some context: the thread's own if it has one; else a
 * primary context already active (the application's or ours), so that a
 * worker of GPU 3 does not pay a context on GPU 0; else the first visible
 * device's.
 */
static int cuda_host_ctx(struct cuda_priv *c, CUcontext *ctx)
{
	CUcontext cur = NULL;
	unsigned flags;
	int active;

	if (c->api.CtxGetCurrent(&cur) == CUDA_SUCCESS && cur) {
		*ctx = cur;
		return 0;
	}
	/* Invisible slots are skipped: their cu would name another GPU. */
	for (int i = 0; i < c->b.ndevices; i++)
		if (c->devs[i].visible &&
		    c->api.DevicePrimaryCtxGetState(c->devs[i].cu, &flags, &active) ==
			    CUDA_SUCCESS &&
		    active)
			return cuda_dev_ctx(c, i, ctx);
	for (int i = 0; i < c->b.ndevices; i++)
		if (c->devs[i].visible)
			return cuda_dev_ctx(c, i, ctx);
	return backend_fail(-ENODEV, "cuda backend: host memory: none of the devices is "
				     "visible in this process (CUDA_VISIBLE_DEVICES)");
}

/* Makes some context fit for host memory current (see cuda_host_ctx). */
static int cuda_host_enter(struct cuda_priv *c, bool *pushed)
{
	CUcontext ctx;
	int rc = cuda_host_ctx(c, &ctx);

	if (rc == 0)
		rc = cuda_ctx_push(c, ctx, pushed);
	return rc;
}

int cuda__host_alloc(struct backend *b, uint64_t size, void **p)
{
	struct cuda_priv *c = b->priv;
	bool pushed;
	CUresult r;
	int rc;

	if (size == 0 || !p)
		return backend_fail(-EINVAL, "cuda backend: host_alloc: size 0 or no result");
	rc = cuda_host_enter(c, &pushed);
	if (rc < 0)
		return rc;
	/* PORTABLE: pinned for every context, as copies run in each device's own. */
	r = CUDA_RELAXED(c, c->api.MemHostAlloc(p, size, CU_MEMHOSTALLOC_PORTABLE));
	cuda_ctx_pop(c, pushed);
	if (r != CUDA_SUCCESS)
		return cuda__fail(c, r, "cuMemHostAlloc", "size=0x%" PRIx64 " (pinned)", size);
	return 0;
}

void cuda__host_free(struct backend *b, void *p, uint64_t size)
{
	struct cuda_priv *c = b->priv;
	bool pushed;
	CUresult r;

	if (!p || cuda_host_enter(c, &pushed) < 0)
		return;
	r = CUDA_RELAXED(c, c->api.MemFreeHost(p));
	cuda_ctx_pop(c, pushed);
	/* No status to return: leave the reason for a caller who looks. */
	if (r != CUDA_SUCCESS)
		cuda__fail(c, r, "cuMemFreeHost", "p=%p size=0x%" PRIx64, p, size);
}

int backend_cuda_mem_info(struct backend *b, int dev, uint64_t *free_bytes, uint64_t *total_bytes)
{
	struct cuda_priv *c;
	size_t fr = 0, tot = 0;
	bool pushed;
	CUresult r;
	int rc;

	if (!b || strcmp(b->ops->name, "cuda") || !free_bytes || !total_bytes)
		return backend_fail(-EINVAL, "backend_cuda_mem_info: not a cuda backend");
	c = b->priv;
	rc = cuda__check_dev(c, "mem_info", dev);
	if (rc == 0)
		rc = cuda_dev_enter(c, dev, &pushed);
	if (rc < 0)
		return rc;
	r = c->api.MemGetInfo(&fr, &tot);
	cuda_ctx_pop(c, pushed);
	if (r != CUDA_SUCCESS)
		return cuda__fail(c, r, "cuMemGetInfo", "dev=%d", dev);
	*free_bytes = fr;
	*total_bytes = tot;
	return 0;
}

void cuda__contents_release(struct backend *b, int dev)
{
	struct cuda_priv *c = b->priv;
	struct cuda_dev *d;
	bool pushed;

	if (dev < 0 || dev >= b->ndevices)
		return;
	d = &c->devs[dev];
	pthread_mutex_lock(&c->lock);
	if (d->ctx) {
		if (d->stream && cuda_ctx_push(c, d->ctx, &pushed) == 0) {
			c->api.StreamDestroy(d->stream);
			cuda_ctx_pop(c, pushed);
		}
		c->api.DevicePrimaryCtxRelease(d->cu);
		d->ctx = NULL;
		d->stream = NULL;
	}
	pthread_mutex_unlock(&c->lock);
}

void cuda__close_dev(struct cuda_priv *c, int dev)
{
	struct cuda_dev *d = &c->devs[dev];
	bool pushed;

	if (!d->ctx)
		return;
	if (d->stream && cuda_ctx_push(c, d->ctx, &pushed) == 0) {
		c->api.StreamDestroy(d->stream);
		cuda_ctx_pop(c, pushed);
	}
	c->api.DevicePrimaryCtxRelease(d->cu);
	*d = (struct cuda_dev){ 0 };
}

/*
 * Pins [p, p+size) for every context (PORTABLE), as host_alloc's memory is:
 * a copy registered this way copies at the pinned speed and is the driver's
 * host memory for cudaHostGetFlags until unregistered.
 */
int cuda__host_register(struct backend *b, void *p, uint64_t size)
{
	struct cuda_priv *c = b->priv;
	bool pushed;
	CUresult r;
	int rc;

	if (size == 0 || !p)
		return backend_fail(-EINVAL, "cuda backend: host_register: empty range");
	rc = cuda_host_enter(c, &pushed);
	if (rc < 0)
		return rc;
	r = CUDA_RELAXED(c, c->api.MemHostRegister(p, size, CU_MEMHOSTREGISTER_PORTABLE));
	cuda_ctx_pop(c, pushed);
	if (r != CUDA_SUCCESS)
		return cuda__fail(c, r, "cuMemHostRegister", "p=%p size=0x%" PRIx64, p, size);
	return 0;
}

void cuda__host_unregister(struct backend *b, void *p, uint64_t size)
{
	struct cuda_priv *c = b->priv;
	bool pushed;
	CUresult r;

	if (!p || cuda_host_enter(c, &pushed) < 0)
		return;
	r = CUDA_RELAXED(c, c->api.MemHostUnregister(p));
	cuda_ctx_pop(c, pushed);
	if (r != CUDA_SUCCESS)
		cuda__fail(c, r, "cuMemHostUnregister", "p=%p size=0x%" PRIx64, p, size);
}
