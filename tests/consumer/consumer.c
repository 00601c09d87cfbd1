/*
 * A program outside the clattn tree: only <clattn.h> and the installed library. Creates a context
 * (CLATTN_DEVICE or the default device), runs a small causal f32 attention through the host-memory
 * helper and checks it against a naive double-precision attention written here. Prints
 * "consumer ok" and exits 0, or prints what went wrong and exits 1. Without an OpenCL device it
 * prints "consumer: no device, skipped" and exits 0, unless CLATTN_REQUIRE_DEVICE=1.
 */
#include <clattn.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { B = 1, H = 2, S = 16, D = 32, N = B * H * S * D };

int main(void)
{
    if (clattn_version_number() != CLATTN_VERSION_NUMBER) {
        fprintf(stderr, "consumer: header is version %d but the library is %s\n",
                CLATTN_VERSION_NUMBER, clattn_version_string());
        return 1;
    }
    clattn_context *ctx = NULL;
    clattn_status st = clattn_create(NULL, &ctx);
    if (st != CLATTN_SUCCESS) {
        const char *req = getenv("CLATTN_REQUIRE_DEVICE");
        if (st == CLATTN_NO_DEVICE && !(req != NULL && strcmp(req, "1") == 0)) {
            printf("consumer: no device, skipped (%s)\n", clattn_last_error(NULL));
            return 0;
        }
        fprintf(stderr, "consumer: clattn_create: %s: %s\n", clattn_status_name(st),
                clattn_last_error(NULL));
        return 1;
    }

    static float q[N], k[N], v[N], out[N];
    unsigned seed = 12345u;
    for (int i = 0; i < N; i++) {
        /* A small LCG: values in [-1, 1), identical on every platform. */
        seed = seed * 1664525u + 1013904223u;
        q[i] = (float)((seed >> 8) / 8388608.0 - 1.0);
        seed = seed * 1664525u + 1013904223u;
        k[i] = (float)((seed >> 8) / 8388608.0 - 1.0);
        seed = seed * 1664525u + 1013904223u;
        v[i] = (float)((seed >> 8) / 8388608.0 - 1.0);
    }
    clattn_attention_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.batch = B;
    desc.heads_q = H;
    desc.heads_kv = H;
    desc.seq_q = S;
    desc.seq_kv = S;
    desc.head_dim = D;
    desc.causal = 1;
    st = clattn_attention_host(ctx, &desc, CLATTN_F32, q, k, v, out, NULL);
    if (st != CLATTN_SUCCESS) {
        fprintf(stderr, "consumer: clattn_attention_host: %s: %s\n", clattn_status_name(st),
                clattn_last_error(ctx));
        clattn_release(ctx);
        return 1;
    }
    clattn_release(ctx);

    /* Naive causal attention in double: row i sees keys 0..i (seq_q == seq_kv). */
    const double scale = 1.0 / sqrt((double)D);
    double worst = 0.0;
    for (int h = 0; h < B * H; h++)
        for (int i = 0; i < S; i++) {
            const float *qi = q + (h * S + i) * D;
            double s[S], mx = -INFINITY, sum = 0.0;
            for (int j = 0; j <= i; j++) {
                double dot = 0.0;
                for (int d = 0; d < D; d++)
                    dot += (double)qi[d] * k[(h * S + j) * D + d];
                s[j] = dot * scale;
                mx = s[j] > mx ? s[j] : mx;
            }
            for (int j = 0; j <= i; j++)
                sum += (s[j] = exp(s[j] - mx));
            for (int d = 0; d < D; d++) {
                double o = 0.0;
                for (int j = 0; j <= i; j++)
                    o += s[j] / sum * v[(h * S + j) * D + d];
                const double got = out[(h * S + i) * D + d], err = fabs(got - o);
                if (!(err <= 1e-5 + 1e-4 * fabs(o))) {
                    fprintf(stderr, "consumer: head %d row %d col %d: got %.9g, want %.9g\n", h, i, d,
                            got, o);
                    return 1;
                }
                worst = err > worst ? err : worst;
            }
        }
    printf("consumer ok (clattn %s, max abs error %.3g)\n", clattn_version_string(), worst);
    return 0;
}
