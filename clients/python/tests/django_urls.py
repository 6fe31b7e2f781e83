"""URLs of the Django test app (test_adapters.py)."""

import json

from django.http import Http404, HttpResponse, JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt


@csrf_exempt
def payments(request):
    if request.method == "GET":
        return JsonResponse({"ctx": request.idempotency is None})
    note = json.loads(request.body)["note"]
    if request.headers.get("X-Abort"):
        raise Http404()
    pid = request.idempotency.connection.execute(
        "INSERT INTO payments (tenant, amount, note) VALUES ('t', 1, %s::text) RETURNING id", (note,)).fetchone()[0]
    if request.headers.get("X-Fail"):
        raise RuntimeError("after the write")
    rv = HttpResponse(json.dumps({"id": pid}), status=201, content_type="application/json")
    rv.set_cookie("a", "1")
    return rv


urlpatterns = [path("payments", payments)]
