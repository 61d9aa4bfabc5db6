"""The gRPC servicers: check the caller, convert, call one service function."""
