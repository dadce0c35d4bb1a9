module monolock

go 1.26
