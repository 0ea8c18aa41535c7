//! When an execution was created, read from its id: a UUID v7 carries its Unix time in
//! milliseconds, so no store keeps a second copy.

/// RFC 3339 in UTC with milliseconds (`2026-12-01T06:59:00.123Z`) of the id's time; the Unix
/// epoch for an id that carries none.
pub(crate) fn created_at(execution_id: &str) -> String {
    let millis = execution_id
        .strip_prefix("exec_")
        .and_then(|uuid| uuid::Uuid::try_parse(uuid).ok())
        .and_then(|uuid| uuid.get_timestamp())
        .map_or(0, |timestamp| {
            let (seconds, nanos) = timestamp.to_unix();
            seconds * 1000 + u64::from(nanos / 1_000_000)
        });
    let days = millis / 86_400_000;
    let of_day = millis % 86_400_000;
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        of_day / 3_600_000,
        of_day / 60_000 % 60,
        of_day / 1000 % 60,
        of_day % 1000
    )
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`, for days after the epoch).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::{civil_from_days, created_at};

    #[test]
    fn dates_from_day_counts() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(20_788), (2026, 12, 1));
    }

    #[test]
    fn created_at_reads_the_uuid_v7_time() {
        // 0x0194_8000_0000 ms after the epoch.
        let id = "exec_01948000-0000-7000-8000-000000000000";
        assert_eq!(created_at(id), "2025-01-19T19:17:51.232Z");
        assert_eq!(created_at("exec_nonsense"), "1970-01-01T00:00:00.000Z");
    }
}
