/*
 * nvml.c - the driver's view of a GPU's memory for the cuda backend, from
 * NVML (libnvidia-ml.so.1, shipped with the driver): total and used bytes
 * of every process on the device, asked without a CUDA context (gmbd runs
 * with none; cuMemGetInfo would need one, about 500 MiB of the GPU).
 *
 * NVML is loaded with dlopen on the first call and stays loaded until the
 * backend closes; a machine without it answers -ENOTSUP, once looked for.
 * Devices are found by their uuid (CUDA's and NVML's are the same 16
 * bytes, NVML spells them "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"), so
 * CUDA_VISIBLE_DEVICES and CUDA's device order do not matter; only when the
 * uuid is not found (a MIG instance) does the CUDA ordinal serve as NVML's
 * index, which matches when CUDA_DEVICE_ORDER=PCI_BUS_ID.
 *
 * The few NVML declarations used are written out here (nvml.h is not part
 * of every toolkit install); they are NVML's stable v1 ABI.
 */
#include "common/backend/libcuda.h"

#define NVML_SUCCESS  0
#define NVML_UUID_LEN 80

typedef int nvml_return;
typedef struct nvml_device_st *nvml_device;

/* nvmlMemory_t */
struct nvml_memory {
	unsigned long long total;
	unsigned long long free;
	unsigned long long used;
};

struct cuda_nvml {
	void *lib;    /* NULL: NVML could not be loaded */
	int load_err; /* why, as -errno */
	nvml_return (*shutdown)(void);
	nvml_return (*by_uuid)(const char *uuid, nvml_device *dev);
	nvml_return (*by_index)(unsigned int index, nvml_device *dev);
	nvml_return (*mem_info)(nvml_device dev, struct nvml_memory *mem);
	const char *(*error_string)(nvml_return r);
	nvml_device devs[BACKEND_MAX_DEVICES];
	bool found[BACKEND_MAX_DEVICES];
};

static int nvml_load(struct cuda_nvml *n);
static int nvml_find(struct cuda_nvml *n, const struct backend_device *bd, int dev);

void cuda__nvml_close(struct cuda_priv *c)
{
	struct cuda_nvml *n = c->nvml;

	if (!n)
		return;
	if (n->lib) {
		n->shutdown();
		dlclose(n->lib);
	}
	free(n);
	c->nvml = NULL;
}

static const char *nvml_error(const struct cuda_nvml *n, nvml_return r)
{
	const char *s = n->error_string ? n->error_string(r) : NULL;

	return s ? s : "unknown NVML error";
}

/* dlsym's answer as a function pointer of @ptr's type. */
#define NVML_SYM(n, ptr, name) (*(void **)&(ptr) = dlsym((n)->lib, (name)))

static int nvml_load(struct cuda_nvml *n)
{
	nvml_return (*init)(void);
	nvml_return r;

	n->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!n->lib)
		return backend_fail(-ENOTSUP, "cuda backend: no NVML (libnvidia-ml.so.1): %s",
				    dlerror());
	if (!NVML_SYM(n, init, "nvmlInit_v2") || !NVML_SYM(n, n->shutdown, "nvmlShutdown") ||
	    !NVML_SYM(n, n->by_uuid, "nvmlDeviceGetHandleByUUID") ||
	    !NVML_SYM(n, n->by_index, "nvmlDeviceGetHandleByIndex_v2") ||
	    !NVML_SYM(n, n->mem_info, "nvmlDeviceGetMemoryInfo") ||
	    !NVML_SYM(n, n->error_string, "nvmlErrorString")) {
		backend_fail(-ENOTSUP, "cuda backend: NVML lacks a function: %s", dlerror());
		goto err_close;
	}
	r = init();
	if (r != NVML_SUCCESS) {
		backend_fail(-ENOTSUP, "cuda backend: nvmlInit_v2: %s (%d)", nvml_error(n, r), r);
		goto err_close;
	}
	return 0;

err_close:
	dlclose(n->lib);
	n->lib = NULL;
	return -ENOTSUP;
}

/* NVML's handle of our device @dev, by uuid, else by CUDA ordinal. */
static int nvml_find(struct cuda_nvml *n, const struct backend_device *bd, int dev)
{
	const uint8_t *u = bd->uuid;
	char uuid[NVML_UUID_LEN];
	nvml_return r;

	if (n->found[dev])
		return 0;
	snprintf(uuid, sizeof(uuid),
		 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0],
		 u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
		 u[14], u[15]);
	r = n->by_uuid(uuid, &n->devs[dev]);
	if (r != NVML_SUCCESS && bd->ordinal >= 0)
		r = n->by_index((unsigned int)bd->ordinal, &n->devs[dev]);
	if (r != NVML_SUCCESS)
		return backend_fail(-ENODEV, "cuda backend: NVML does not know device %d (%s): %s",
				    dev, uuid, nvml_error(n, r));
	n->found[dev] = true;
	return 0;
}

int cuda__driver_mem(struct backend *b, int dev, uint64_t *total, uint64_t *used)
{
	struct cuda_priv *c = b->priv;
	struct nvml_memory mem = { 0 };
	nvml_return r;
	int rc;

	if (dev < 0 || dev >= b->ndevices)
		return backend_fail(-ENODEV, "cuda backend: driver_mem: no device %d", dev);
	pthread_mutex_lock(&c->lock);
	if (!c->nvml) {
		c->nvml = calloc(1, sizeof(*c->nvml));
		if (!c->nvml) {
			pthread_mutex_unlock(&c->lock);
			return backend_fail(-ENOMEM, "cuda backend: out of memory for NVML");
		}
		c->nvml->load_err = nvml_load(c->nvml);
	}
	rc = c->nvml->load_err;
	if (rc == 0)
		rc = nvml_find(c->nvml, &b->devices[dev], dev);
	if (rc == 0) {
		r = c->nvml->mem_info(c->nvml->devs[dev], &mem);
		if (r != NVML_SUCCESS)
			rc = backend_fail(-EIO, "cuda backend: nvmlDeviceGetMemoryInfo: %s (%d)",
					  nvml_error(c->nvml, r), r);
	}
	pthread_mutex_unlock(&c->lock);
	if (rc < 0)
		return rc;
	*total = mem.total;
	*used = mem.used;
	return 0;
}
