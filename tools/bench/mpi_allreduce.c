/* mpi_allreduce.c — the OpenMPI side of bench_comm: the same sizes and timing method as pdde's
 * worker (in-place f32 sum, barrier before each sample, median of repeats on rank 0). Built with
 * mpicc by `make bench-comm`, not by the library build. Prints "RES <bytes> <seconds per op>". */
#include <mpi.h>
#include <stdio.h>
#include "bench_common.h"

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int me;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    size_t max = argc > 1 ? strtoull(argv[1], NULL, 10) : (size_t)256 << 20;
    float *buf = calloc(max / 4 + 1, 4);
    for (size_t bytes = 8; bytes <= max; bytes = bench_next_size(bytes)) {
        int count = (int)(bytes / 4), iters = bench_iters(bytes), reps = bench_reps(bytes);
        double t[16];
        MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); /* warm-up */
        for (int r = 0; r < reps; r++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            for (int i = 0; i < iters; i++) MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            t[r] = (MPI_Wtime() - t0) / iters;
        }
        if (me == 0) printf("RES %zu %.9g\n", bytes, bench_median(t, reps));
        fflush(stdout);
    }
    free(buf);
    MPI_Finalize();
    return 0;
}
