/* Status strings and the runtime version, both generated from the lists in clattn.h. */
#include "internal.h"

const char *clattn_status_string(clattn_status status)
{
    switch (status) {
#define CLATTN_STATUS_TEXT_(name, value, text) \
    case CLATTN_##name:                        \
        return text;
        CLATTN_STATUS_LIST(CLATTN_STATUS_TEXT_)
#undef CLATTN_STATUS_TEXT_
    }
    return "unknown status";
}

const char *clattn_status_name(clattn_status status)
{
    switch (status) {
#define CLATTN_STATUS_NAME_(name, value, text) \
    case CLATTN_##name:                        \
        return "CLATTN_" #name;
        CLATTN_STATUS_LIST(CLATTN_STATUS_NAME_)
#undef CLATTN_STATUS_NAME_
    }
    return "CLATTN_UNKNOWN";
}

unsigned clattn_version_number(void) { return CLATTN_VERSION_NUMBER; }

const char *clattn_version_string(void) { return CLATTN_VERSION_STRING; }

size_t clattn_dtype_size(clattn_dtype dtype)
{
    switch (dtype) {
    case CLATTN_F32:
        return 4;
    case CLATTN_F16:
    case CLATTN_BF16:
        return 2;
    case CLATTN_I8:
    case CLATTN_FP8_E4M3:
    case CLATTN_FP8_E5M2:
        return 1;
    case CLATTN_Q8_0:
        return 34;
    case CLATTN_Q4_0:
        return 18;
    }
    return 0;
}

int clattn_dtype_block(clattn_dtype dtype)
{
    if (dtype == CLATTN_Q8_0 || dtype == CLATTN_Q4_0)
        return 32;
    return clattn_dtype_size(dtype) ? 1 : 0;
}

const char *clattn_dtype_name(clattn_dtype dtype)
{
    switch (dtype) {
    case CLATTN_F32:
        return "f32";
    case CLATTN_F16:
        return "f16";
    case CLATTN_BF16:
        return "bf16";
    case CLATTN_I8:
        return "i8";
    case CLATTN_FP8_E4M3:
        return "fp8_e4m3";
    case CLATTN_FP8_E5M2:
        return "fp8_e5m2";
    case CLATTN_Q8_0:
        return "q8_0";
    case CLATTN_Q4_0:
        return "q4_0";
    }
    return NULL;
}
