/*
 * cuda_error.c - the cuda backend's failure sentences (the driver's error
 * name and text) and its device check, shared by cuda.c and
 * cuda_contents.c; calls neither.
 */
#include "common/backend/libcuda.h"

static int cuda_errno(CUresult r)
{
	switch (r) {
	case CUDA_ERROR_OUT_OF_MEMORY:
		return -ENOMEM;
	case CUDA_ERROR_INVALID_VALUE:
	case CUDA_ERROR_INVALID_HANDLE:
		return -EINVAL;
	case CUDA_ERROR_NOT_SUPPORTED:
		return -EOPNOTSUPP;
	case CUDA_ERROR_NO_DEVICE:
	case CUDA_ERROR_NOT_INITIALIZED:
	case CUDA_ERROR_DEINITIALIZED:
	case CUDA_ERROR_INVALID_DEVICE:
		return -ENODEV;
	case CUDA_ERROR_OPERATING_SYSTEM:
		/* What the driver reports at the open-file limit (GPU-FACTS.md). */
		return -EMFILE;
	case CUDA_ERROR_ALREADY_MAPPED:
		return -EBUSY;
	default:
		return -EIO;
	}
}

/* The driver's name and sentence for @r (its number in @num if it has none); never NULL. */
void cuda__err_text(struct cuda_priv *c, CUresult r, const char **name, const char **text,
		    char num[static 24])
{
	if (!c->api.GetErrorName || c->api.GetErrorName(r, name) != CUDA_SUCCESS || !*name) {
		snprintf(num, 24, "CUresult %d", (int)r);
		*name = num;
	}
	if (!c->api.GetErrorString || c->api.GetErrorString(r, text) != CUDA_SUCCESS || !*text)
		*text = "no description";
}

/* Records "cuda backend: CALL: NAME (sentence) FACTS"; returns the errno for @r. */
int cuda__fail(struct cuda_priv *c, CUresult r, const char *call, const char *fmt, ...)
{
	const char *name, *text;
	char facts[ERR_MSG_MAX / 2], num[24];
	va_list ap;

	va_start(ap, fmt);
	err_vfmt(facts, sizeof(facts), 0, fmt, ap);
	va_end(ap);
	cuda__err_text(c, r, &name, &text, num);
	return backend_fail(cuda_errno(r), "cuda backend: %s: %s (%s) %s", call, name, text, facts);
}

/* Loading the driver. */

/* Device checks, as the host backend makes them. */

int cuda__check_dev(struct cuda_priv *c, const char *op, int dev)
{
	if (dev < 0 || dev >= c->b.ndevices)
		return backend_fail(-EINVAL, "cuda backend: %s: no device %d (have %d)", op, dev,
				    c->b.ndevices);
	if (c->b.devices[dev].ordinal < 0)
		return backend_fail(-ENODEV,
				    "cuda backend: %s: device %d is not visible in this "
				    "process (CUDA_VISIBLE_DEVICES)",
				    op, dev);
	return 0;
}
