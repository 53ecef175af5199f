"""Litestar: the app, its controllers, page views, multipart uploads and session progress."""
