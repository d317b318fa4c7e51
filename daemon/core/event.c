/*
 * event.c - the names of event kinds and refusal reasons (event.h).
 */
#include <errno.h>
#include <stddef.h>

#include "daemon/core/event.h"

static const char *const event_kind_names[EVENT_NKINDS] = {
	[EVENT_SUBSCRIBED] = "subscribed",
	[EVENT_CONNECTED] = "connected",
	[EVENT_GONE] = "gone",
	[EVENT_ALLOC] = "alloc",
	[EVENT_FREE] = "free",
	[EVENT_PAUSE] = "pause",
	[EVENT_RESUME] = "resume",
	[EVENT_REFUSED] = "refused",
	[EVENT_DROP] = "drop",
	[EVENT_TRIM] = "trim",
	[EVENT_CONTROL] = "control",
	[EVENT_DROPPED] = "dropped",
	[EVENT_MISSED] = "missed",
	[EVENT_IMPORT] = "import",
	[EVENT_IMPORT_CLOSE] = "import_close",
	[EVENT_IMPORT_UNMAP] = "import_unmap",
	[EVENT_IMPORT_MAP] = "import_map",
	[EVENT_OBJECT_PUBLISH] = "object_publish",
	[EVENT_OBJECT_DROP] = "object_drop",
	[EVENT_OBJECT_PAUSE] = "object_pause",
	[EVENT_OBJECT_RESUME] = "object_resume",
};

static const char *const event_reason_names[EVENT_NREASONS] = {
	[EVENT_REASON_BUDGET] = "budget",
	[EVENT_REASON_PERMISSION] = "permission",
	[EVENT_REASON_NO_CONTROL] = "no_control",
	[EVENT_REASON_NOT_FOUND] = "not_found",
	[EVENT_REASON_BUSY] = "busy",
	[EVENT_REASON_TIMEOUT] = "timeout",
	[EVENT_REASON_INVALID] = "invalid",
	[EVENT_REASON_OTHER] = "other",
};

const char *event_kind_name(enum event_kind k)
{
	if ((unsigned)k >= EVENT_NKINDS || !event_kind_names[k])
		return "unknown";
	return event_kind_names[k];
}

enum event_reason event_reason_of(int status)
{
	switch (-status) {
	case ENOMEM:
	case ENOSPC:
	case EMFILE:
		return EVENT_REASON_BUDGET;
	case EPERM:
	case EACCES:
		return EVENT_REASON_PERMISSION;
	case EOPNOTSUPP:
		return EVENT_REASON_NO_CONTROL;
	case ENOENT:
	case ENODEV:
	case ESRCH:
		return EVENT_REASON_NOT_FOUND;
	case EBUSY:
	case EAGAIN:
	case EALREADY:
		return EVENT_REASON_BUSY;
	case ETIMEDOUT:
		return EVENT_REASON_TIMEOUT;
	case EINVAL:
	case ENAMETOOLONG:
	case ENOTUNIQ:
	case E2BIG:
		return EVENT_REASON_INVALID;
	default:
		return EVENT_REASON_OTHER;
	}
}

const char *event_reason_name(enum event_reason r)
{
	if ((unsigned)r >= EVENT_NREASONS)
		return "other";
	return event_reason_names[r];
}
