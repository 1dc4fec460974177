module github.com/greendot/greendot

go 1.26.8

require (
	github.com/coder/websocket v1.8.15 // indirect
	github.com/golang-jwt/jwt/v5 v5.3.1 // indirect
	go.uber.org/goleak v1.3.0 // indirect
)
