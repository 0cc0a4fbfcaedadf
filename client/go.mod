module github.com/floodgate-dev/floodgate/client

go 1.22
