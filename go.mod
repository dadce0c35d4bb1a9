module github.com/monolock-dev/monolock

go 1.26
