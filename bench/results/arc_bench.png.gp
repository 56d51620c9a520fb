set terminal pngcairo size 1200,800 font ',10'
set output 'bench/results/arc_bench.png'
set title 'BF16 weight-update payload vs density (lower is better)'
set xlabel 'changed values per step (%)'
set ylabel 'payload (% of BF16 bytes)'
set termoption noenhanced
set logscale xy
set grid
set key outside right top
plot for [i=0:15] 'bench/results/arc_bench.png.dat' index i using 1:2 with linespoints lw (i == 0 ? 3 : 1) pt (i % 13 + 1) dashtype i / 8 + 1 title columnheader(1)
