"""`conditional`'s pure parts: an object's age by the store's clock, and which stores get
conditional writes (tests/lease_race_test.py runs them against an emulator)."""

import pytest

from papa_jax.workdir import conditional, lease
from tests import fake_gcs

pytestmark = pytest.mark.unit


def test_age_is_the_stores_date_minus_the_objects_updated_time():
  date = "Mon, 07 Dec 2026 19:32:33 GMT"
  assert conditional.age(date, "2026-12-07T19:30:33.250Z") == pytest.approx(119.75)
  assert conditional.age(date, "2026-12-07T19:32:32.404916Z") == pytest.approx(0.595084)
  assert conditional.age(date, "2026-12-07T19:32:33.9Z") == 0  # `Date` rounds down.
  assert conditional.age(None, "2026-12-07T19:30:33Z") == 0  # No `Date`: as if just written.


def test_only_gcsfs_gets_conditional_writes():
  for path in ("/tmp/wd/.lock", "s3://bucket/wd/.lock", "memory://wd/.lock"):
    assert conditional.filesystem(path) is None
  with fake_gcs.install():  # The in-memory gs:// of tests/storage_test.py: the older lease.
    assert conditional.filesystem("gs://bucket/wd/.lock") is None


def test_an_unreadable_lease_names_no_holder():
  version = conditional.Version(generation=1, data=b"{cut", age=0.0)
  assert lease._holder(version) == {}  # pylint: disable=protected-access
  assert lease._holder(None) == {}  # pylint: disable=protected-access
  assert lease.describe(lease._holder(  # pylint: disable=protected-access
      conditional.Version(1, b'{"host": "h", "pid": 3, "started": "t"}', 0.0))) == (
          "host h, pid 3, started t")
