class ServiceError(Exception):
    """The scheduler refused a frame (ErrorReply) or could not be reached in time."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class RequestError(Exception):
    """One request failed on the server: bad parameters, prompt too long, worker error."""

    def __init__(self, request_id: str, code: str, message: str):
        super().__init__(f"request {request_id}: {code}: {message}")
        self.request_id = request_id
        self.code = code
        self.message = message


class ChatTemplateError(ValueError):
    """A conversation could not be rendered: the model has no chat template, or it failed."""
