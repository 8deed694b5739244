/* mpi_alltoallv.c — the Open MPI side of bench_moe's all-to-all: the same sizes (the bytes one rank
 * sends, in equal parts to every rank) and timing method as its pdde worker (barrier before each
 * sample, median of repeats on rank 0; the buffers filled first). Built with mpicc by `make bench-moe`, not by the library
 * build. Usage: mpi_alltoallv [MIN MAX] (bytes). Prints "RES <bytes> <seconds per op>". */
#include <mpi.h>
#include <stdio.h>
#include "bench_common.h"

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int me, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    size_t min = argc > 2 ? strtoull(argv[1], NULL, 10) : 64, max = argc > 2 ? strtoull(argv[2], NULL, 10) : (size_t)16 << 20;
    float *send = calloc(max / 4 + (size_t)n, 4), *recv = calloc(max / 4 + (size_t)n, 4);
    for (size_t i = 0; i < max / 4 + (size_t)n; i++) send[i] = (float)(i % 1000), recv[i] = 0; /* real pages, not the zero page */
    int *counts = calloc((size_t)n, sizeof *counts), *displs = calloc((size_t)n, sizeof *displs);
    for (size_t bytes = 64; bytes <= max; bytes = bench_next_size(bytes)) {
        if (bytes < min) continue;
        int per = (int)(bytes / 4 / (size_t)n), iters = bench_iters(bytes), reps = bench_reps(bytes);
        for (int r = 0; r < n; r++) counts[r] = per, displs[r] = r * per;
        double t[16];
        MPI_Alltoallv(send, counts, displs, MPI_FLOAT, recv, counts, displs, MPI_FLOAT, MPI_COMM_WORLD); /* warm-up */
        for (int r = 0; r < reps; r++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            for (int i = 0; i < iters; i++) MPI_Alltoallv(send, counts, displs, MPI_FLOAT, recv, counts, displs, MPI_FLOAT, MPI_COMM_WORLD);
            t[r] = (MPI_Wtime() - t0) / iters;
        }
        if (me == 0) printf("RES %zu %.9g\n", bytes, bench_median(t, reps));
        fflush(stdout);
    }
    free(send), free(recv), free(counts), free(displs);
    MPI_Finalize();
    return 0;
}
